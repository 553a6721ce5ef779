"""The token memory's advanced context against the same memory fitting the whole tail.

Over a store that says what a session gained since the last read (``tail_since``), the token
memory advances its last context by the new messages instead of fitting the tail again. A
state machine of appends (by the memory, by another writer, with and without counts, pinned
messages among them, results out of place, call ids used twice), edits, retention, expiry,
setting changes and reads checks that every read, sync and async, shows exactly what a twin
memory that always fits the tail shows: the same context, the same stats, the same error;
over the in-memory store and over a SQLite file that a second store writes to as well.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import tempfile
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from _validators import validate_openai_chat
from zerda import ApproxCounter, Message, Role, ToolCall, to_openai
from zerda.errors import ContextOverflowError
from zerda.memory import ConversationTokenBufferMemory
from zerda.stores import InMemoryStore, Since, SQLiteStore, Store

COUNTER = ApproxCounter()
TEXT = st.text(alphabet="ab cd", min_size=1, max_size=30)


class FittingOnly(ConversationTokenBufferMemory):
    """The token memory that never advances a kept context: it fits the tail on every read."""

    def _usable_window(self) -> None:
        return None


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def outcome(memory: ConversationTokenBufferMemory, tools: Any = None) -> object:
    try:
        context, stats = memory.get_context_with_stats(tools=tools)
    except ContextOverflowError as exc:
        return ("overflow", str(exc), exc.needed, exc.limit)
    return context, stats


async def aoutcome(memory: ConversationTokenBufferMemory) -> object:
    try:
        context, stats = await memory.aget_context_with_stats()
    except ContextOverflowError as exc:
        return ("overflow", str(exc), exc.needed, exc.limit)
    return context, stats


class AdvancedEqualsFitted(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ids = itertools.count()
        self.stores: list[Store] = []

    @initialize(
        kind=st.sampled_from(["memory", "sqlite"]),
        limit=st.integers(20, 200),
        reserve=st.integers(0, 10),
        retention=st.one_of(st.none(), st.integers(4, 40)),
        ttl=st.booleans(),
    )
    def start(self, kind: str, limit: int, reserve: int, retention: int | None, ttl: bool) -> None:
        self.clock = Clock()
        where: dict[str, Any] = {
            "max_messages": retention,
            "ttl": 60.0 if ttl else None,
            "clock": self.clock,
        }
        if kind == "memory":
            self.store: Store = InMemoryStore(**where)
            other: Store = self.store
        else:  # another worker writes through a store of its own over the same file
            self.folder = tempfile.mkdtemp(prefix="zerda-advance-")
            path = os.path.join(self.folder, "chats.db")
            self.store, other = SQLiteStore(path, **where), SQLiteStore(path, **where)
            self.stores += [self.store, other]
        options: dict[str, Any] = {
            "max_token_limit": limit,
            "reserve_tokens": min(reserve, limit - 1),
            "token_counter": COUNTER,
            "session_id": "s",
        }
        self.memory = ConversationTokenBufferMemory(store=self.store, **options)
        self.twin = FittingOnly(store=self.store, **options)
        self.other = ConversationTokenBufferMemory(store=other, **options)
        self.other_store = other

    def teardown(self) -> None:
        for store in self.stores:
            store.close()
        if self.stores:
            shutil.rmtree(self.folder)

    # -- what is appended ------------------------------------------------------------------

    def call_id(self, data: st.DataObject) -> str:
        # Now and then an id used before: models that number their calls call_0 every turn.
        if data.draw(st.integers(0, 5)) == 0:
            return f"call_{data.draw(st.integers(0, 2))}"
        return f"c{next(self.ids)}"

    def turn(self, data: st.DataObject) -> list[Message]:
        out = [Message(Role.USER, data.draw(TEXT))]
        for _ in range(data.draw(st.integers(0, 3))):
            kind = data.draw(st.sampled_from(["reply", "calls", "system"]))
            if kind == "reply":
                out.append(Message(Role.ASSISTANT, data.draw(TEXT)))
            elif kind == "system":
                out.append(Message(Role.SYSTEM, data.draw(TEXT)))
            else:
                calls = [
                    ToolCall(self.call_id(data), "f", data.draw(st.sampled_from(["{}", '{"a":1}'])))
                    for _ in range(data.draw(st.integers(1, 2)))
                ]
                out.append(Message(Role.ASSISTANT, None, tool_calls=tuple(calls)))
                results = [Message(Role.TOOL, data.draw(TEXT), tool_call_id=c.id) for c in calls]
                # Results in order (mostly), shuffled, one missing or one twice.
                shape = data.draw(st.sampled_from(["ok"] * 6 + ["shuffled", "missing", "twice"]))
                if shape == "shuffled":
                    results = data.draw(st.permutations(results))
                elif shape == "missing":
                    results = results[1:]
                elif shape == "twice":
                    results.append(results[0])
                out.extend(results)
        return out

    def pieces(self, data: st.DataObject) -> list[Message]:
        """A turn, or part of one (a reply or results arriving on their own, or an
        interjection between a call and its results)."""
        messages = self.turn(data)
        if data.draw(st.integers(0, 5)) == 0:
            return messages[data.draw(st.integers(0, len(messages) - 1)) :]
        return messages

    @rule(data=st.data(), turns=st.integers(1, 3))
    def converse(self, data: st.DataObject, turns: int) -> None:
        """What an application does: a turn or a few, then the context for the next call."""
        for _ in range(turns):
            self.memory.add_messages(self.turn(data))
        self.read()

    @rule(data=st.data())
    def add(self, data: st.DataObject) -> None:
        self.memory.add_messages(self.pieces(data))

    @rule(data=st.data(), counted=st.booleans())
    def another_worker_adds(self, data: st.DataObject, counted: bool) -> None:
        batch = self.pieces(data)
        if counted:
            self.other.add_messages(batch)
        else:  # stored without counts: the reader counts them
            self.other_store.append("s", [m.stamped() for m in batch])

    @rule(data=st.data())
    def edit(self, data: st.DataObject) -> None:
        store = data.draw(st.sampled_from([self.store, self.other_store]))
        history = store.history("s")
        what = data.draw(st.sampled_from(["pop", "delete", "edit"]))
        if what == "pop" or not history:
            store.pop_turn("s")
            return
        target = data.draw(st.sampled_from(history))
        assert target.id is not None
        if what == "delete":
            store.delete_messages("s", [target.id])
        else:
            store.edit_message("s", target.id, data.draw(TEXT))

    @rule(limit=st.integers(20, 200))
    def change_the_budget(self, limit: int) -> None:
        for memory in (self.memory, self.twin):
            memory.max_token_limit = limit
            memory.reserve_tokens = min(memory.reserve_tokens, limit - 1)

    @precondition(lambda self: self.store.ttl is not None)
    @rule(seconds=st.sampled_from([1.0, 59.0, 61.0]))
    def time_passes(self, seconds: float) -> None:
        self.clock.now += seconds

    @rule()
    def clear(self) -> None:
        self.other_store.delete_session("s")

    # -- reads -----------------------------------------------------------------------------

    @rule()
    def read(self) -> None:
        got = outcome(self.memory)
        assert got == outcome(self.twin)
        if not isinstance(got, tuple) or got[0] != "overflow":
            context = got[0]  # type: ignore[index]
            validate_openai_chat(to_openai(context))

    @rule()
    def read_twice(self) -> None:
        first = outcome(self.memory)
        assert outcome(self.memory) == first == outcome(self.twin)

    @rule()
    def read_async(self) -> None:
        assert asyncio.run(aoutcome(self.memory)) == outcome(self.twin)

    @rule()
    def read_with_other_tools(self) -> None:
        tools = [{"type": "function", "function": {"name": "g", "parameters": {}}}]
        assert outcome(self.memory, tools) == outcome(self.twin, tools)


AdvancedEqualsFitted.TestCase.settings = settings(
    max_examples=120, stateful_step_count=50, deadline=None
)
TestAdvancedEqualsFitted = AdvancedEqualsFitted.TestCase


@st.composite
def conversations(draw: st.DrawFn) -> list[list[Message]]:
    """Batches as an application sends them, one a turn or a step of one: mostly well
    formed, with call ids used again (``call_0`` every turn) and now and then a result out of
    place, a call left unanswered, a system message or a greeting."""
    ids = itertools.count()
    batches: list[list[Message]] = []
    if draw(st.integers(0, 5)) == 0:
        batches.append([Message(Role.ASSISTANT, "Welcome!")])
    for _ in range(draw(st.integers(1, 30))):
        turn = [Message(Role.USER, draw(TEXT))]
        for _ in range(draw(st.integers(0, 3))):
            if draw(st.booleans()):
                turn.append(Message(Role.ASSISTANT, draw(TEXT)))
                continue
            reused = draw(st.integers(0, 3)) == 0
            call = ToolCall(f"call_{draw(st.integers(0, 1))}" if reused else f"c{next(ids)}", "f")
            turn.append(Message(Role.ASSISTANT, None, tool_calls=(call,)))
            fault = draw(st.integers(0, 12))
            if fault == 0:
                continue  # unanswered
            if fault == 1:
                turn.append(Message(Role.USER, "wait"))  # an interjection before the result
            turn.append(Message(Role.TOOL, draw(TEXT), tool_call_id=call.id))
        if draw(st.integers(0, 15)) == 0:
            turn.insert(draw(st.integers(0, len(turn))), Message(Role.SYSTEM, draw(TEXT)))
        if draw(st.booleans()):
            cut = draw(st.integers(1, len(turn)))
            batches += [turn[:cut], turn[cut:]] if cut < len(turn) else [turn]
        else:
            batches.append(turn)
    return batches


STORES = {"memory": InMemoryStore, "sqlite": lambda: SQLiteStore(":memory:")}


@pytest.mark.parametrize("kind", sorted(STORES))
@settings(max_examples=150, deadline=None)
@given(conversations(), st.integers(15, 160), st.data())
def test_each_read_after_each_batch_is_what_fitting_gives(
    kind: str, batches: list[list[Message]], limit: int, data: st.DataObject
) -> None:
    """Every read after every batch (the path of an application): the advanced context and
    stats are those of the memory that fits the tail, including where a read falls back."""
    store = STORES[kind]()
    options: dict[str, Any] = {"token_counter": COUNTER, "store": store, "session_id": "s"}
    memory = ConversationTokenBufferMemory(limit, **options)
    twin = FittingOnly(limit, **options)
    for batch in batches:
        memory.add_messages(batch)
        assert outcome(memory) == outcome(twin)
        if data.draw(st.integers(0, 20), label="edit") == 0 and store.history("s"):
            store.pop_turn("s")
    store.close()


@pytest.mark.parametrize("kind", sorted(STORES))
def test_a_long_session_read_after_every_turn(kind: str) -> None:
    """Hundreds of turns, a small budget: the kept window drops turns on most reads and lets
    the dropped ones go now and then; every read is still what fitting gives."""
    store = STORES[kind]()
    options: dict[str, Any] = {"token_counter": COUNTER, "store": store, "session_id": "s"}
    memory = ConversationTokenBufferMemory(120, **options)
    twin = FittingOnly(120, **options)
    memory.add_messages([Message(Role.SYSTEM, "be brief")])
    for n in range(300):
        call = ToolCall(f"call_{n % 3}", "lookup", json.dumps({"n": n}))  # ids used again
        memory.add_messages(
            [
                Message(Role.USER, "order " + "x" * (n % 17)),
                Message(Role.ASSISTANT, None, tool_calls=(call,)),
                Message(Role.TOOL, "found " * (n % 5), tool_call_id=call.id),
                Message(Role.ASSISTANT, "done"),
            ][: 4 if n % 7 else 1]
        )
        assert outcome(memory) == outcome(twin)
    window = memory._window
    assert window is not None
    assert window.first < len(window.turn_starts)
    assert len(window.messages) <= 2 * len(memory.get_context()) + 64


def test_a_read_after_an_append_costs_what_was_appended() -> None:
    """Advancing reads the new messages only: the store is asked for what came since the
    last read, and each message is counted once, when it was added."""
    store = InMemoryStore()
    memory = ConversationTokenBufferMemory(200, token_counter=COUNTER, store=store)
    memory.add_messages([Message(Role.SYSTEM, "be brief")])
    for i in range(50):
        memory.add_messages([Message(Role.USER, f"question {i}"), Message(Role.ASSISTANT, "ok")])
        memory.get_context()
    asked: list[object] = []
    tail, since = store.tail, store.tail_since

    def spy_tail(*args: Any) -> Any:
        asked.append("tail")
        return tail(*args)

    def spy_since(*args: Any) -> Any:
        result = since(*args)
        asked.append(len(result.messages) if result is not None else None)
        return result

    store.tail, store.tail_since = spy_tail, spy_since  # type: ignore[method-assign]
    memory.add_messages([Message(Role.USER, "last"), Message(Role.ASSISTANT, "done")])
    context = memory.get_context()
    assert asked == [2]
    assert context[-1].text == "done"
    assert memory.get_context() == context
    assert asked == [2, 0]
    # An edit by anyone makes the kept context stale: the next read fits the tail again.
    store.pop_turn("default")
    assert memory.get_context()[-1].text == "ok"
    assert asked == [2, 0, None, "tail"]


def test_a_stale_or_foreign_cursor_reads_the_tail_again() -> None:
    store = InMemoryStore()
    store.append("a", [Message(Role.USER, "hi").stamped()])
    cursor = store.tail("a", None).cursor
    assert store.tail_since("a", cursor) == Since((), (), (), 1, 1, cursor)
    assert store.tail_since("b", cursor) is None  # another session
    assert store.tail_since("a", "nonsense") is None
    assert store.tail_since("a", (cursor[0], cursor[1] + 5)) is None  # past the end
    store.append("a", [Message(Role.SYSTEM, "rules").stamped()])
    assert store.tail_since("a", cursor) is None  # a pinned message: read the tail again
    store.delete_session("a")
    assert store.tail_since("a", cursor) is None

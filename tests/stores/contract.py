"""The store contract suite: one set of tests every backend passes (DESIGN.md §5).

A backend opts in by subclassing ``StoreContract`` (sync ``Store``) and/or
``AsyncStoreContract`` (``AsyncStore``) in a module of ``tests/stores/`` whose class name starts
with ``Test``, and saying how to make a fresh store::

    from stores.contract import AsyncStoreContract, StoreContract
    from zerda.stores import SQLiteStore


    class TestSQLiteStore(StoreContract):
        supports_processes = True  # optional: run the shared-data and 4-process tests

        def make_store(self, **options):
            # options: ttl=, max_messages=, clock= (a FakeClock); pass them all through.
            # Each call must return a fresh, empty store: fresh_path() gives a new file.
            return SQLiteStore(self.fresh_path(".db"), **options)

        def reopen_recipe(self, store):
            # Optional: how to open another store over the same data (in this process, or in
            # a spawned one): an importable "module:Class" and picklable keyword arguments,
            # without clock= (the suite adds it in-process; children use the real clock).
            return "zerda.stores:SQLiteStore", {"path": str(store.path)}


    class TestAsyncSQLiteStore(AsyncStoreContract):
        ...  # the same two methods, with AsyncSQLiteStore

``make_store`` may also be ``async def`` in an ``AsyncStoreContract`` subclass; its store is
then made inside the test's event loop. Inside a test, ``self.tmp_path`` is pytest's
``tmp_path`` and ``self.clock`` the fake clock. Stores are closed (``close`` / ``aclose``) when
the test ends.

Capabilities (class attributes / methods, all optional):

- ``reopen_recipe(store)`` returning a recipe: the suite checks that a second store over the
  same data sees everything (messages, token counts, metadata, session times).
- ``supports_processes = True`` (needs ``reopen_recipe``): two stores over the same data see
  each other's writes, and 4 spawned processes x 500 batch appends to one session lose
  nothing and never interleave.

Every expectation here is computed by the small models below (``turns_of``, ``model_tail``,
``model_retention``), written from the contract, not from a backend.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import itertools
import json
import random
import string
import threading
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pytest

from _processes import run_processes
from zerda.errors import (
    ConfigurationError,
    InvalidMessageError,
    InvalidSessionIdError,
    MessageNotFoundError,
    SessionExistsError,
)
from zerda.memory import ConversationBufferMemory
from zerda.messages import PINNED, Message, Role, ToolCall, group_turns
from zerda.parts import AudioPart, FilePart, ImagePart, ReasoningPart, TextPart
from zerda.stores import AsyncStore, InMemoryStore, SessionInfo, Store, Tail

__all__ = ["AsyncStoreContract", "FakeClock", "StoreContract"]

T = TypeVar("T")
Recipe = tuple[str, dict[str, Any]]

T0 = 1_700_000_000.125  # a binary fraction: stored times must keep it exactly


class FakeClock:
    """A clock the test moves by hand: ``clock()`` is the time, ``advance(s)`` moves it."""

    def __init__(self, start: float = T0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


# -- messages and the models of what a store must show -----------------------------------------

_stamps = itertools.count()


def msg(role: str, content: str | None, **extra: Any) -> Message:
    """A message with a distinct ``created_at`` (stores must give it back exactly)."""
    extra.setdefault("created_at", 1_600_000_000.0 + next(_stamps) / 10)
    return Message(Role(role), content, **extra)


def user(text: str, **extra: Any) -> Message:
    return msg("user", text, **extra)


def assistant(text: str | None, **extra: Any) -> Message:
    return msg("assistant", text, **extra)


def system(text: str, **extra: Any) -> Message:
    return msg("system", text, **extra)


def tool(text: str, call_id: str) -> Message:
    return msg("tool", text, tool_call_id=call_id)


@dataclass
class Entry:
    """A message as appended, with the counts given for it (counter name -> count)."""

    message: Message
    counts: dict[str, int] = field(default_factory=dict)


def entries(batch: Sequence[Message], tokens: Mapping[str, Sequence[int]] | None) -> list[Entry]:
    return [
        Entry(m, {name: counts[i] for name, counts in (tokens or {}).items()})
        for i, m in enumerate(batch)
    ]


def turns_of(log: Sequence[Entry]) -> list[list[Entry]]:
    """The turns of a log: a new one at each user message, and at the first non-system
    message if the log does not open with a user message; system messages belong to none."""
    turns: list[list[Entry]] = []
    for e in log:
        if e.message.role in PINNED:
            continue
        if e.message.role is Role.USER or not turns:
            turns.append([])
        turns[-1].append(e)
    return turns


@dataclass
class ExpectedTail:
    system: list[Message]
    messages: list[Message]
    turn_starts: list[int]
    total_turns: int
    total_messages: int
    tokens: list[int | None]
    system_tokens: list[int | None]


def model_tail(log: Sequence[Entry], turns: int | None, counter: str | None) -> ExpectedTail:
    """What ``tail(turns, counter)`` must return for a session whose history is ``log``."""
    all_turns = turns_of(log)
    n = len(all_turns) if turns is None else min(turns, len(all_turns))
    picked = all_turns[len(all_turns) - n :]
    flat = [e for t in picked for e in t]
    starts = list(itertools.accumulate([0] + [len(t) for t in picked[:-1]])) if picked else []
    systems = [e for e in log if e.message.role in PINNED]
    return ExpectedTail(
        system=[e.message for e in systems],
        messages=[e.message for e in flat],
        turn_starts=starts,
        total_turns=len(all_turns),
        total_messages=len(log),
        tokens=[e.counts.get(counter) for e in flat] if counter is not None else [],
        system_tokens=[e.counts.get(counter) for e in systems] if counter is not None else [],
    )


def model_retention(log: Sequence[Entry], keep: int) -> list[Entry]:
    """The history after keeping at least the last ``keep`` messages by whole turns: the log
    from the newest turn start that leaves ``keep`` or more messages, preceded by every system
    message from before that point (pinned, so never dropped)."""
    starts, seen = [], False
    for i, e in enumerate(log):
        if e.message.role is Role.USER or (not seen and e.message.role not in PINNED):
            starts.append(i)
        seen = seen or e.message.role not in PINNED
    fitting = [s for s in starts if len(log) - s >= keep]
    cut = max(fitting, default=0)
    return [e for e in log[:cut] if e.message.role in PINNED] + list(log[cut:])


def assert_tail(tail: Tail, expected: ExpectedTail) -> None:
    """Compare field by field, so a failure says which part of the tail is wrong."""
    assert list(tail.system) == expected.system, "system"
    assert list(tail.messages) == expected.messages, "messages"
    assert list(tail.turn_starts) == expected.turn_starts, "turn_starts"
    assert tail.total_turns == expected.total_turns, "total_turns"
    assert tail.total_messages == expected.total_messages, "total_messages"
    assert list(tail.tokens) == expected.tokens, "tokens"
    assert list(tail.system_tokens) == expected.system_tokens, "system_tokens"
    assert all(m.role not in PINNED for m in tail.messages)
    assert tail.complete == (len(expected.turn_starts) == expected.total_turns)


def assert_same_tail(got: Tail, expected: Tail) -> None:
    """Two tails read from stores hold the same, field by field."""
    assert list(got.system) == list(expected.system), "system"
    assert list(got.messages) == list(expected.messages), "messages"
    assert list(got.turn_starts) == list(expected.turn_starts), "turn_starts"
    assert (got.total_turns, got.total_messages) == (expected.total_turns, expected.total_messages)
    assert list(got.tokens) == list(expected.tokens), "tokens"
    assert list(got.system_tokens) == list(expected.system_tokens), "system_tokens"
    assert canonical(dict(got.metadata)) == canonical(dict(expected.metadata)), "metadata"


def canonical(value: Any) -> str:
    """JSON text that tells 1e16 from 10**16: equal texts, equal values and types."""
    return json.dumps(value, sort_keys=True)


def nested(depth: int) -> Any:
    """``depth`` lists, one inside the other."""
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def cas_increment(s: Any, session_id: str) -> None:
    """Add one to the reserved counter ``zerda.n`` by compare-and-set, retrying on conflict."""
    while True:
        current = s.get_metadata(session_id).get("zerda.n")
        if s.compare_and_set(session_id, "zerda.n", current, (current or 0) + 1):
            return


def native_async_reading_what_sync_wrote(target: str) -> AsyncStore:
    """The native async store ``open_native_async`` gives for ``target`` (what zerda serve
    answers through), checked to read what the sync store of the same ``target`` wrote."""
    from zerda.stores._open import open_native_async, open_store

    with open_store(target) as store:
        store.append("s", [Message(Role.USER, "written sync")])
    native = open_native_async(target)
    assert native is not None

    async def main() -> list[Any]:
        async with native:  # type: ignore[attr-defined]  # every native async store is one
            return [m.content for m in await native.ahistory("s")]

    assert asyncio.run(main()) == ["written sync"]
    return native


def assert_empty(tail: Tail) -> None:
    assert list(tail.system) == []
    assert list(tail.messages) == []
    assert list(tail.turn_starts) == []
    assert (tail.total_turns, tail.total_messages) == (0, 0)
    assert list(tail.tokens) == []
    assert list(tail.system_tokens) == []


# A conversation with every shape a tail must handle: an opening greeting (a turn without a
# user message), a tool-call turn with two results, system messages at the start, inside a
# turn and at the end, an empty user message, and a turn that is a lone user message.
S0 = system("You are terse.")
GREET = assistant("Hello! How can I help?")
U1 = user("Weather and time in Paris?")
CALLS = assistant(
    None,
    tool_calls=(
        ToolCall("call_1", "get_weather", '{"city": "Paris"}'),
        ToolCall("call_2", "get_time", '{"tz": "Europe/Paris"}'),
    ),
)
R1 = tool("18°C", "call_1")
R2 = tool("14:00", "call_2")
A1 = assistant("18°C at 14:00.")
U2 = user("Thanks")
S1 = system("Be polite.")
A2 = assistant("You're welcome.")
U3 = user("")
U4 = user("Again?")
A4 = assistant("Yes.", name="bot")
S2 = system("The session ends soon.")

RICH_BATCHES: list[tuple[list[Message], dict[str, list[int]] | None]] = [
    ([S0], {"x": [7]}),
    ([GREET], {"x": [11], "y": [12]}),
    ([U1, CALLS], {"x": [21, 22]}),
    ([R1, R2, A1], None),
    ([U2, S1, A2], {"x": [31, 32, 33], "y": [34, 35, 36]}),
    ([U3], {"y": [41]}),
    ([U4, A4, S2], {"x": [51, 52, 53]}),
]
RICH_TURNS = 5
RICH_LOG_MESSAGES = [m for batch, _ in RICH_BATCHES for m in batch]


# -- concurrent writers: tagged batches, and a check that they arrived whole and in order -------


def tagged_batch(writer: int, batch: int, size: int) -> list[Message]:
    """One turn of ``size`` messages tagged ``writer:batch:index/size``."""
    return [
        Message(Role.USER if i == 0 else Role.ASSISTANT, f"{writer}:{batch}:{i}/{size}")
        for i in range(size)
    ]


def tag_count(writer: int, batch: int, index: int) -> int:
    """The token count stored with a tagged message: its tag as a number."""
    return writer * 1_000_000 + batch * 10 + index


def tagged_tokens(writer: int, batch: int, size: int) -> dict[str, list[int]]:
    return {"tag": [tag_count(writer, batch, i) for i in range(size)]}


def thread_batch_size(batch: int) -> int:
    return 1 + batch % 3


def _parse(m: Message) -> tuple[int, int, int, int]:
    head, _, size = (m.content or "").partition("/")
    writer, batch, index = head.split(":")
    return int(writer), int(batch), int(index), int(size)


def check_batches(
    history: Sequence[Message], writers: int, batches: int, tokens: Sequence[int | None]
) -> None:
    """Every batch of every writer is in ``history`` exactly once, its messages contiguous and
    in order, each writer's batches in the order written, each message with its own count."""
    seen: dict[int, list[int]] = {w: [] for w in range(writers)}
    i = 0
    while i < len(history):
        writer, batch, index, size = _parse(history[i])
        assert index == 0, f"message {i} ({history[i].content}) does not start a batch"
        for j in range(size):
            assert _parse(history[i + j]) == (writer, batch, j, size), (
                f"batch {writer}:{batch} interleaved at message {i + j}: {history[i + j].content}"
            )
        seen[writer].append(batch)
        i += size
    for writer, order in seen.items():
        assert order == list(range(batches)), f"writer {writer}: batches lost or out of order"
    assert list(tokens) == [tag_count(*_parse(m)[:3]) for m in history], "token counts moved"


def check_whole_turns(tail: Tail) -> str | None:
    """Why a tail read during concurrent writes is torn (``None``: it is whole)."""
    starts = [*tail.turn_starts, len(tail.messages)]
    for begin, end in itertools.pairwise(starts):
        turn = [_parse(m) for m in tail.messages[begin:end]]
        size = turn[0][3]
        if len(turn) != size or [t[2] for t in turn] != list(range(size)):
            return f"torn turn in a tail read: {[m.content for m in tail.messages[begin:end]]}"
    return None


def _load(target: str) -> Any:
    module, _, qualname = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def process_writer(
    recipe: Recipe,
    use_async: bool,
    writer: int,
    batches: int,
    size: int,
    session_id: str,
    barrier: Any,
) -> None:
    """The body of one writer process (module level, so a spawned process can import it)."""
    target, kwargs = recipe
    factory = _load(target)

    if use_async:

        async def main() -> None:
            store = factory(**kwargs)
            barrier.wait(60)  # blocking is fine: nothing else runs in this process
            for b in range(batches):
                batch, tokens = tagged_batch(writer, b, size), tagged_tokens(writer, b, size)
                await store.aappend(session_id, batch, tokens)
            await store.aclose()

        asyncio.run(main())
        return
    store = factory(**kwargs)
    barrier.wait(60)
    for b in range(batches):
        store.append(session_id, tagged_batch(writer, b, size), tagged_tokens(writer, b, size))
    store.close()


def process_incrementer(recipe: Recipe, use_async: bool, increments: int, barrier: Any) -> None:
    """One process adding ``increments`` to a shared counter by compare-and-set."""
    target, kwargs = recipe
    factory = _load(target)

    if use_async:

        async def main() -> None:
            store = factory(**kwargs)
            barrier.wait(60)
            for _ in range(increments):
                while True:
                    current = (await store.aget_metadata("counter")).get("zerda.n")
                    if await store.acompare_and_set(
                        "counter", "zerda.n", current, (current or 0) + 1
                    ):
                        break
            await store.aclose()

        asyncio.run(main())
        return
    store = factory(**kwargs)
    barrier.wait(60)
    for _ in range(increments):
        cas_increment(store, "counter")
    store.close()


# -- running one body of tests over the sync or the async protocol -------------------------------


class AsyncDriver:
    """The sync face of an AsyncStore: each call runs its ``a``-twin on the test's loop."""

    def __init__(self, store: AsyncStore, loop: asyncio.AbstractEventLoop) -> None:
        self.store = store
        self._loop = loop

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run_until_complete(coro)

    def append(self, session_id: str, messages: Sequence[Message], tokens: Any = None) -> int:
        return self._run(self.store.aappend(session_id, messages, tokens))

    def append_then_tail(
        self,
        session_id: str,
        messages: Sequence[Message],
        tokens: Any,
        turns: int | None,
        counter: str | None = None,
    ) -> tuple[int, Tail]:
        return self._run(self.store.aappend_then_tail(session_id, messages, tokens, turns, counter))

    def tail(self, session_id: str, turns: int | None, counter: str | None = None) -> Tail:
        return self._run(self.store.atail(session_id, turns, counter))

    def tail_since(self, session_id: str, cursor: object, counter: str | None = None) -> Any:
        return self._run(self.store.atail_since(session_id, cursor, counter))

    def history(self, session_id: str) -> list[Message]:
        return self._run(self.store.ahistory(session_id))

    def get_metadata(self, session_id: str) -> dict[str, Any]:
        return self._run(self.store.aget_metadata(session_id))

    def update_metadata(self, session_id: str, values: Mapping[str, Any]) -> None:
        self._run(self.store.aupdate_metadata(session_id, values))

    def compare_and_set(self, session_id: str, key: str, expected: Any, value: Any) -> bool:
        return self._run(self.store.acompare_and_set(session_id, key, expected, value))

    def list_sessions(self) -> list[SessionInfo]:
        return self._run(self.store.alist_sessions())

    def delete_session(self, session_id: str) -> bool:
        return self._run(self.store.adelete_session(session_id))

    def clear(self) -> None:
        self._run(self.store.aclear())

    def purge_expired(self) -> int:
        return self._run(self.store.apurge_expired())

    def delete_messages(self, session_id: str, ids: Any) -> int:
        return self._run(self.store.adelete_messages(session_id, ids))

    def pop_turn(self, session_id: str) -> list[Message]:
        return self._run(self.store.apop_turn(session_id))

    def fork(self, session_id: str, new_session_id: str, at: str | None = None) -> int:
        return self._run(self.store.afork(session_id, new_session_id, at))

    def edit_message(self, session_id: str, message_id: str, content: Any) -> Message:
        return self._run(self.store.aedit_message(session_id, message_id, content))


INVALID_IDS: list[object] = [
    "",
    "x" * 201,
    "a b",
    "a'b",
    'a"b',
    "'; DROP TABLE x; --",
    "../../etc",
    "a/b",
    "{tag}",
    "user:*",
    "a\nb",
    "a\x00b",
    "café",
    123,
    None,
    b"abc",
    ["a"],
]
VALID_IDS = [
    string.ascii_letters + string.digits + "_.:@+=-",
    "x" * 200,
    "a",
    "tenant:user@example.com",
]


class _Contract:
    """The tests both protocols share, written against ``self.open()`` (a sync face)."""

    supports_processes: ClassVar[bool] = False
    # The multi-process run: writers x batches of 3 messages to one session. A backend whose
    # every write costs a whole-file rewrite may lower these (the issue asks 4 x 500 of SQLite).
    process_writers: ClassVar[int] = 4
    process_batches: ClassVar[int] = 500
    use_async: ClassVar[bool] = False

    tmp_path: Path
    clock: FakeClock

    # -- what a backend provides --------------------------------------------------------------

    def make_store(
        self, *, ttl: float | None, max_messages: int | None, clock: Callable[[], float]
    ) -> Any:
        """A fresh, empty store with these options (may be ``async def`` for async stores)."""
        raise NotImplementedError(f"{type(self).__name__} must define make_store(**options)")

    def reopen_recipe(self, store: Any) -> Recipe | None:
        """``("module:Class", kwargs)`` opening another store over ``store``'s data."""
        return None

    # -- plumbing ---------------------------------------------------------------------------------

    @pytest.fixture(autouse=True)
    def _contract_env(self, tmp_path: Path) -> Iterator[None]:
        self.tmp_path = tmp_path
        self.clock = FakeClock()
        self._paths = itertools.count()
        self._stores: list[Any] = []
        self._loop = asyncio.new_event_loop()
        try:
            yield
        finally:
            try:
                for store in reversed(self._stores):
                    if self.use_async:
                        self._loop.run_until_complete(store.aclose())
                    else:
                        store.close()
            finally:
                self._loop.close()

    def fresh_path(self, suffix: str = "") -> Path:
        """A path under ``tmp_path`` that no other store of this test uses."""
        return self.tmp_path / f"store{next(self._paths)}{suffix}"

    def open_raw(self, *, ttl: float | None = None, max_messages: int | None = None) -> Any:
        """A fresh store from the backend (closed when the test ends)."""
        store = self.make_store(ttl=ttl, max_messages=max_messages, clock=self.clock)
        if inspect.isawaitable(store):
            store = self._loop.run_until_complete(store)
        self._stores.append(store)
        return store

    def drive(self, store: Any) -> Any:
        """The sync face the shared tests use: the store, or its async twins run on a loop."""
        if self.use_async:
            assert isinstance(store, AsyncStore), f"{store!r} does not implement AsyncStore"
            return AsyncDriver(store, self._loop)
        assert isinstance(store, Store), f"{store!r} does not implement Store"
        return store

    def open(self, *, ttl: float | None = None, max_messages: int | None = None) -> Any:
        return self.drive(self.open_raw(ttl=ttl, max_messages=max_messages))

    @staticmethod
    def raw(s: Any) -> Any:
        """The store behind a sync face."""
        return s.store if isinstance(s, AsyncDriver) else s

    def reopen(self, store: Any) -> Any:
        """A second store over ``store``'s data, from the backend's recipe, made here."""
        recipe = self.reopen_recipe(store)
        if recipe is None:
            pytest.skip(f"{type(self).__name__} has no reopen_recipe: its data is not shared")
        target, kwargs = recipe
        other = _load(target)(**{**kwargs, "clock": self.clock})
        if inspect.isawaitable(other):
            other = self._loop.run_until_complete(other)
        self._stores.append(other)
        return self.drive(other)

    @staticmethod
    def append_all(
        s: Any,
        session_id: str,
        batches: Sequence[tuple[Sequence[Message], Mapping[str, Sequence[int]] | None]],
    ) -> list[Entry]:
        log: list[Entry] = []
        for batch, tokens in batches:
            s.append(session_id, batch, tokens)
            log += entries(batch, tokens)
        return log

    # -- editing the log (issue #16) --------------------------------------------------------------

    def edit_log(self, s: Any) -> list[Message]:
        """A session "e" of three turns with a tool call, a pinned system message in the middle,
        and counts by two counters; its messages as stored."""
        log = [
            system("be brief", id="sys1"),
            user("hi", id="u1"),
            assistant("hello", id="a1"),
            user("order a latte", id="u2"),
            msg(
                "assistant", None, id="a2", tool_calls=(ToolCall("c1", "order", '{"d": "latte"}'),)
            ),
            Message(Role.TOOL, "ok", tool_call_id="c1", id="t1"),
            system("prices changed", id="sys2"),
            assistant("ordered", id="a3"),
            user("thanks", id="u3"),
            assistant("bye", id="a4"),
        ]
        s.append("e", log[:6], {"c": [1, 2, 3, 4, 5, 6], "d": [6, 5, 4, 3, 2, 1]})
        s.append("e", log[6:], {"c": [7, 8, 9, 10]})
        return log

    def test_delete_messages_removes_them_and_their_counts(self) -> None:
        s = self.open()
        log = self.edit_log(s)
        assert s.delete_messages("e", ["a1", "t1", "nope"]) == 2
        kept = [m for m in log if m.id not in ("a1", "t1")]
        assert s.history("e") == kept
        tail = s.tail("e", None, "c")
        assert [m.id for m in (*tail.system, *tail.messages)] == [
            "sys1",
            "sys2",
            "u1",
            "u2",
            "a2",
            "a3",
            "u3",
            "a4",
        ]
        assert list(tail.tokens) == [2, 4, 5, 8, 9, 10]
        assert list(tail.system_tokens) == [1, 7]
        assert s.tail("e", None, "d").tokens[:3] == [5, 3, 2]
        assert s.delete_messages("e", ["a1"]) == 0, "deleting twice deletes nothing more"

    def test_deleting_a_user_message_joins_its_answers_to_the_turn_before(self) -> None:
        s = self.open()
        self.edit_log(s)
        assert s.delete_messages("e", ["u2"]) == 1
        tail = s.tail("e", None)
        assert tail.total_turns == 2
        assert [[m.id for m in t.messages] for t in group_turns(tail.messages)] == [
            ["u1", "a1", "a2", "t1", "a3"],
            ["u3", "a4"],
        ]

    def test_delete_system_messages_and_everything(self) -> None:
        s = self.open()
        log = self.edit_log(s)
        assert s.delete_messages("e", ["sys2"]) == 1
        assert [m.id for m in s.tail("e", None).system] == ["sys1"]
        assert s.delete_messages("e", [m.id for m in log]) == len(log) - 1
        assert s.history("e") == []
        assert s.tail("e", None).total_messages == 0

    def test_a_deleted_id_may_be_appended_again(self) -> None:
        s = self.open()
        log = self.edit_log(s)
        s.delete_messages("e", ["a4"])
        assert s.append("e", [log[-1]]) == 1
        assert s.history("e") == log

    @pytest.mark.parametrize("ids", ["a1", None, 3, [3], [""], b"a1"])
    def test_delete_messages_refuses_what_is_not_a_list_of_ids(self, ids: Any) -> None:
        s = self.open()
        log = self.edit_log(s)
        with pytest.raises(ConfigurationError):
            s.delete_messages("e", ids)
        assert s.history("e") == log

    def test_edits_of_a_missing_session(self) -> None:
        s = self.open()
        assert s.delete_messages("none", ["x"]) == 0
        assert s.pop_turn("none") == []
        assert s.fork("none", "copy") == 0
        assert s.list_sessions() == [], "nothing was created"
        with pytest.raises(MessageNotFoundError):
            s.edit_message("none", "x", "text")
        with pytest.raises(MessageNotFoundError):
            s.fork("none", "copy", at="x")

    def test_pop_turn_returns_the_newest_turn_and_keeps_system_messages(self) -> None:
        s = self.open()
        log = self.edit_log(s)
        assert s.pop_turn("e") == log[8:]
        assert s.history("e") == log[:8]
        popped = s.pop_turn("e")
        assert popped == [log[3], log[4], log[5], log[7]]  # sys2 is pinned: it stays
        assert s.history("e") == [*log[:3], log[6]]
        tail = s.tail("e", None, "c")
        assert tail.total_turns == 1
        assert list(tail.tokens) == [2, 3]
        assert s.pop_turn("e") == log[1:3]
        assert s.pop_turn("e") == []
        assert s.history("e") == [log[0], log[6]]

    def test_pop_turn_of_an_opening_greeting(self) -> None:
        s = self.open()
        greeting = assistant("welcome", id="g")
        s.append("g", [system("s", id="s"), greeting])
        assert s.pop_turn("g") == [greeting]
        assert [m.id for m in s.history("g")] == ["s"]

    def test_fork_copies_up_to_a_message_and_leaves_the_source(self) -> None:
        s = self.open()
        log = self.edit_log(s)
        s.update_metadata("e", {"topic": "coffee"})
        assert s.fork("e", "f", at="t1") == 6
        assert s.history("f") == log[:6]
        assert s.history("e") == log
        tail = s.tail("f", None, "c")
        assert list(tail.tokens) == [2, 3, 4, 5, 6]
        assert s.tail("f", None, "d").tokens[-1] == 1
        assert s.get_metadata("f") == {"topic": "coffee"}
        # The two sessions go their own ways.
        s.append("f", [user("other", id="u9")])
        assert s.history("e") == log
        assert s.fork("e", "g") == len(log)
        assert s.history("g") == log
        info = {i.session_id: i for i in s.list_sessions()}
        assert (info["f"].messages, info["g"].messages) == (7, len(log))

    def test_fork_refuses_an_existing_session_and_an_unknown_message(self) -> None:
        s = self.open()
        log = self.edit_log(s)
        s.append("taken", [user("mine")])
        with pytest.raises(SessionExistsError):
            s.fork("e", "taken")
        s.update_metadata("meta-only", {"k": 1})
        with pytest.raises(SessionExistsError):
            s.fork("e", "meta-only")
        with pytest.raises(MessageNotFoundError, match="nope"):
            s.fork("e", "new", at="nope")
        with pytest.raises(InvalidSessionIdError):
            s.fork("e", "bad id")
        assert [m.text for m in s.history("taken")] == ["mine"]
        assert s.history("new") == []
        assert s.history("e") == log

    def test_edit_message_keeps_its_place_and_drops_its_counts(self) -> None:
        s = self.open()
        log = self.edit_log(s)
        self.clock.advance(5)
        new = s.edit_message("e", "u2", "order a flat white")
        assert new.text == "order a flat white"
        assert (new.id, new.role, new.created_at) == ("u2", Role.USER, log[3].created_at)
        assert new.metadata["edited_at"] == self.clock()
        history = s.history("e")
        assert history == [*log[:3], new, *log[4:]]
        tail = s.tail("e", None, "c")
        assert list(tail.tokens) == [2, 3, None, 5, 6, 8, 9, 10]
        parts = (TextPart("see"), ImagePart("https://example.com/a.png"))
        assert s.edit_message("e", "u3", parts).content == parts
        assert s.history("e")[8].content == parts

    def test_edit_message_refuses_bad_content_and_unknown_ids(self) -> None:
        s = self.open()
        log = self.edit_log(s)
        with pytest.raises(InvalidMessageError):
            s.edit_message("e", "u1", None)  # a user message needs content
        with pytest.raises(InvalidMessageError):
            s.edit_message("e", "u1", 42)
        with pytest.raises(MessageNotFoundError, match="nope"):
            s.edit_message("e", "nope", "x")
        assert s.history("e") == log
        # An assistant message with calls may lose its text.
        assert s.edit_message("e", "a2", None).content is None

    def test_edits_are_writes_that_refresh_the_ttl(self) -> None:
        s = self.open(ttl=10)
        self.edit_log(s)
        for step, edit in enumerate(
            [
                lambda: s.delete_messages("e", ["a4"]),
                lambda: s.pop_turn("e"),
                lambda: s.edit_message("e", "u1", "hey"),
            ]
        ):
            self.clock.advance(8)
            edit()
            info = s.list_sessions()
            assert [i.session_id for i in info] == ["e"], step
            assert info[0].updated_at == self.clock()

    def test_an_expired_session_has_nothing_to_edit(self) -> None:
        s = self.open(ttl=10)
        self.edit_log(s)
        self.clock.advance(11)
        assert s.delete_messages("e", ["u1"]) == 0
        assert s.pop_turn("e") == []
        assert s.fork("e", "f") == 0
        with pytest.raises(MessageNotFoundError):
            s.edit_message("e", "u1", "x")

    def test_edits_are_seen_by_another_store_over_the_same_data(self) -> None:
        s = self.open()
        log = self.edit_log(s)
        other = self.reopen(self.raw(s))
        s.delete_messages("e", ["a1"])
        s.fork("e", "f", at="u2")
        assert other.history("e") == [m for m in log if m.id != "a1"]
        assert [m.id for m in other.history("f")] == ["sys1", "u1", "u2"]

    # -- construction ---------------------------------------------------------------------------

    @pytest.mark.parametrize("ttl", [0, -1, True, "10"])
    def test_bad_ttl_is_refused(self, ttl: Any) -> None:
        with pytest.raises(ConfigurationError):
            self.open(ttl=ttl)

    @pytest.mark.parametrize("max_messages", [0, -1, 1.5, True, "10"])
    def test_bad_max_messages_is_refused(self, max_messages: Any) -> None:
        with pytest.raises(ConfigurationError):
            self.open(max_messages=max_messages)

    # -- order, atomicity, isolation ------------------------------------------------------------

    def test_missing_session_reads_as_empty(self) -> None:
        s = self.open()
        assert_empty(s.tail("nobody", None))
        assert_empty(s.tail("nobody", 3, "x"))
        assert s.history("nobody") == []
        assert s.get_metadata("nobody") == {}
        assert s.list_sessions() == []
        assert s.delete_session("nobody") is False
        assert s.purge_expired() == 0
        assert s.list_sessions() == [], "reads must not create a session"

    def test_order_kept_across_batches(self) -> None:
        s = self.open()
        sent: list[Message] = []
        for b in range(30):
            batch = [user(f"q{b}")] + [assistant(f"a{b}.{i}") for i in range(b % 4)]
            s.append("s", batch)
            sent += batch
        assert s.history("s") == sent
        assert list(s.tail("s", None).messages) == sent

    def test_empty_batch_adds_nothing(self) -> None:
        s = self.open()
        s.append("s", [U1], {"x": [1]})
        s.append("s", [], {"x": []})
        s.append("s", [])
        assert s.history("s") == [U1]
        assert list(s.tail("s", None, "x").tokens) == [1]

    @pytest.mark.parametrize(
        ("batch", "tokens"),
        [
            pytest.param([U2, A2, {"role": "user", "content": "a dict"}], None, id="dict-item"),
            pytest.param([U2, A2, "just text"], None, id="str-item"),
            pytest.param([U2, A2, None], None, id="none-item"),
            pytest.param([U2, A2, A4], {"x": [1, 2]}, id="too-few-counts"),
            pytest.param([U2, A2, A4], {"x": [1, 2, 3, 4]}, id="too-many-counts"),
            pytest.param([U2, A2, A4], {"x": [1, 2, 3], "y": [1]}, id="one-counter-short"),
            pytest.param(
                [user("a", id="dup"), assistant("b"), assistant("c", id="dup")],
                None,
                id="one-id-twice",
            ),
        ],
    )
    def test_bad_batch_stores_nothing(self, batch: list[Any], tokens: Any) -> None:
        # The bad element comes last, so a backend that writes as it goes would be caught.
        s = self.open()
        s.append("s", [U1, A1], {"x": [1, 2]})
        s.update_metadata("s", {"k": 1})
        self.clock.advance(5)
        before = (s.history("s"), s.list_sessions(), s.tail("s", None, "x"), s.get_metadata("s"))
        for session_id in ("s", "fresh"):
            with pytest.raises(ConfigurationError):
                s.append(session_id, batch, tokens)
        after = (s.history("s"), s.list_sessions(), s.tail("s", None, "x"), s.get_metadata("s"))
        assert after == before, "a refused batch changed the store"
        assert s.history("fresh") == []
        assert [i.session_id for i in s.list_sessions()] == ["s"]

    def test_sessions_are_isolated(self) -> None:
        s = self.open()
        a = [user("a1"), assistant("a2")]
        b = [system("b0"), user("b1")]
        s.append("a", a[:1], {"x": [1]})
        s.append("b", b[:1], {"x": [2]})
        s.append("a", a[1:], {"x": [3]})
        s.append("b", b[1:], {"x": [4]})
        s.update_metadata("a", {"who": "a"})
        s.update_metadata("b", {"who": "b"})
        assert s.history("a") == a
        assert s.history("b") == b
        assert list(s.tail("a", None, "x").tokens) == [1, 3]
        assert list(s.tail("b", None, "x").system_tokens) == [2]
        assert list(s.tail("b", None, "x").tokens) == [4]
        assert list(s.tail("a", None).system) == []
        assert s.get_metadata("a") == {"who": "a"}
        assert s.delete_session("a") is True
        assert s.history("a") == []
        assert s.history("b") == b
        assert s.get_metadata("b") == {"who": "b"}
        # Prefixes and near-names are other sessions too.
        s.append("b.1", [user("other")])
        assert s.history("b") == b

    def test_developer_messages_are_pinned_like_system_messages(self) -> None:
        s = self.open()
        d0, d1 = msg("developer", "Answer in French."), msg("developer", "Be brief.")
        log = self.append_all(
            s,
            "s",
            [([d0, U1, A1], {"x": [1, 2, 3]}), ([U2, d1, S1, A2], {"x": [4, 5, 6, 7]})],
        )
        assert_tail(s.tail("s", None, "x"), model_tail(log, None, "x"))
        tail = s.tail("s", 1, "x")
        assert list(tail.system) == [d0, d1, S1]
        assert list(tail.messages) == [U2, A2]
        assert list(tail.system_tokens) == [1, 5, 6]
        assert tail.total_turns == 2
        assert s.history("s") == [e.message for e in log]

    def test_content_parts_are_kept_exactly(self) -> None:
        """Every part type, with the extras of the formats they came from, and tool calls with
        extras: given back equal, field by field, by a read and by a reopened store."""
        png = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJ"
        parts = (
            TextPart("What is on this receipt?", extra={"anthropic": {"cache_control": {}}}),
            ImagePart(png, detail="high"),
            ImagePart(None, file_id="file-9", media_type="image/jpeg"),
            ImagePart("https://example.com/cat.png", detail="low", media_type="image/png"),
            AudioPart("UklGRiQAAABXQVZF", "wav"),
            FilePart("data:application/pdf;base64,JVBERi0x", filename="receipt.pdf"),
            FilePart(None, file_id="file-2", url="https://example.com/r.pdf"),
        )
        thinking = ReasoningPart(
            "The total is at the bottom.", signature="sig==", extra={"gemini": {"n": [1, 2]}}
        )
        call = ToolCall("c1", "save", '{"total": 12.4}', extra={"gemini": {"sig": "abc"}})
        log = [
            msg("developer", "Answer in French."),
            Message(Role.USER, parts, created_at=1_600_000_001.5, id="u1"),
            Message(
                Role.ASSISTANT,
                (thinking, TextPart("12,40 €")),
                tool_calls=(call,),
                created_at=1_600_000_002.5,
                id="a1",
            ),
            Message(Role.TOOL, (TextPart("saved"),), tool_call_id="c1", id="t1"),
            Message(Role.ASSISTANT, (ReasoningPart("", encrypted="gAAA=="),), id="a2"),
        ]
        s = self.open()
        assert s.append("s", log) == len(log)
        stored = s.history("s")
        assert stored == log
        assert [m.to_dict() for m in stored] == [m.to_dict() for m in log]
        tail = s.tail("s", None, None)
        assert [*tail.system, *tail.messages] == log
        assert tail.messages[0].content == parts  # a tuple of parts, in order, equal
        if self.supports_processes:
            assert self.reopen(self.raw(s)).history("s") == log

    # -- ids: exactly-once appends ----------------------------------------------------------------

    def test_append_says_how_many_it_stored(self) -> None:
        s = self.open()
        assert s.append("s", [U1, CALLS, R1], {"x": [1, 2, 3]}) == 3
        assert s.append("s", []) == 0
        assert s.append("s", [user("q", id="m1"), assistant("a", id="m2")]) == 2

    def test_appending_the_same_batch_twice_stores_it_once(self) -> None:
        s = self.open()
        first = [user("q", id="m1"), assistant("a", id="m2")]
        s.append("s", [S0, GREET])
        s.append("s", first, {"x": [1, 2]})
        before = (s.history("s"), s.tail("s", None, "x"), s.list_sessions())
        assert s.append("s", first, {"x": [1, 2]}) == 0
        assert s.append("s", list(reversed(first)), {"x": [2, 1]}) == 0
        after = (s.history("s"), s.tail("s", None, "x"), s.list_sessions())
        assert after[0] == before[0], "a retried batch was stored again"
        assert_same_tail(after[1], before[1])
        assert [(i.messages, i.turns) for i in after[2]] == [
            (i.messages, i.turns) for i in before[2]
        ]
        assert [m.id for m in s.history("s")] == [None, None, "m1", "m2"]

    def test_a_batch_overlapping_what_is_stored_adds_only_the_new_messages(self) -> None:
        s = self.open()
        held = [user("q1", id="u1"), assistant("a1", id="a1"), system("s1", id="s1")]
        log = self.append_all(s, "s", [(held, {"x": [1, 2, 3]})])
        # New messages between held ones: the new user message must start a turn of its own
        # and the held ones must not move or be counted again.
        batch = [
            held[1],
            assistant("a1 bis", id="a1b"),
            held[2],
            user("q2", id="u2"),
            held[0],
            system("s2", id="s2"),
            assistant("a2"),
        ]
        counts = {"x": [10, 11, 12, 13, 14, 15, 16], "y": [20, 21, 22, 23, 24, 25, 26]}
        assert s.append("s", batch, counts) == 4
        kept = [1, 3, 5, 6]
        log += [Entry(batch[i], {name: column[i] for name, column in counts.items()}) for i in kept]
        assert s.history("s") == [e.message for e in log]
        for counter in ("x", "y", None):
            for turns in (None, 1, 2):
                assert_tail(s.tail("s", turns, counter), model_tail(log, turns, counter))
        [info] = s.list_sessions()
        assert (info.messages, info.turns) == (len(log), 2)

    def test_messages_without_ids_are_always_stored(self) -> None:
        s = self.open()
        assert s.append("s", [U1, A1]) == 2
        assert s.append("s", [U1, A1]) == 2
        assert s.history("s") == [U1, A1, U1, A1]

    def test_ids_belong_to_their_session(self) -> None:
        s = self.open()
        batch = [user("q", id="m1"), assistant("a", id="m2")]
        assert s.append("a", batch) == 2
        assert s.append("b", batch) == 2
        assert s.history("a") == s.history("b") == batch

    def test_a_deleted_session_forgets_its_ids(self) -> None:
        s = self.open()
        batch = [user("q", id="m1"), assistant("a", id="m2")]
        s.append("s", batch)
        assert s.delete_session("s") is True
        assert s.append("s", batch) == 2
        assert s.history("s") == batch
        s.clear()
        assert s.append("s", batch) == 2

    def test_an_expired_session_forgets_its_ids(self) -> None:
        s = self.open(ttl=10)
        batch = [user("q", id="m1"), assistant("a", id="m2")]
        s.append("s", batch)
        self.clock.advance(10)
        assert s.append("s", batch) == 2
        assert s.history("s") == batch

    def test_ids_come_back_with_their_messages(self) -> None:
        s = self.open()
        long_id = "é" * 255
        batch = [system("p", id="sys-1"), user("q", id=long_id), assistant("a", id="a:1/2 b")]
        s.append("s", batch)
        assert [m.id for m in s.history("s")] == ["sys-1", long_id, "a:1/2 b"]
        tail = s.tail("s", None)
        assert [m.id for m in (*tail.system, *tail.messages)] == ["sys-1", long_id, "a:1/2 b"]

    def test_append_then_tail_is_append_and_tail(self) -> None:
        s = self.open()
        log = self.append_all(s, "s", RICH_BATCHES[:3])
        s.update_metadata("s", {"k": [1, 2]})
        batch, tokens = RICH_BATCHES[3]
        stored, tail = s.append_then_tail("s", batch, tokens, 2, "x")
        log += entries(batch, tokens)
        assert stored == len(batch)
        assert_tail(tail, model_tail(log, 2, "x"))
        assert dict(tail.metadata) == {"k": [1, 2]}
        q = user("q", id="q")
        stored, tail = s.append_then_tail("fresh", [q], None, None)
        assert (stored, list(tail.messages)) == (1, [q])
        stored, tail = s.append_then_tail("fresh", [q], {"x": [1]}, None, "x")
        assert (stored, list(tail.messages), list(tail.tokens)) == (0, [q], [None])

    # -- the tail carries the session's metadata -------------------------------------------------

    def test_tail_carries_the_metadata(self) -> None:
        s = self.open()
        assert dict(s.tail("s", None).metadata) == {}
        s.append("s", [U1, A1])
        assert dict(s.tail("s", 1).metadata) == {}
        s.update_metadata("s", {"summary": "so far", "n": [1, {"a": None}]})
        for turns in (None, 0, 1):
            assert dict(s.tail("s", turns).metadata) == s.get_metadata("s")
        s.update_metadata("m", {"only": "metadata"})
        assert dict(s.tail("m", None).metadata) == {"only": "metadata"}
        tail = s.tail("s", None)
        if isinstance(tail.metadata, dict):
            tail.metadata["n"].append("changed")
            tail.metadata["new"] = 1
        assert s.get_metadata("s") == {"summary": "so far", "n": [1, {"a": None}]}

    # -- compare_and_set: atomic, and the one way to change a reserved key ----------------------

    def test_compare_and_set(self) -> None:
        s = self.open()
        key = "zerda.summary"
        assert s.compare_and_set("s", key, None, {"text": "a", "turns": 1}) is True
        assert s.compare_and_set("s", key, None, {"text": "b", "turns": 2}) is False
        assert s.get_metadata("s") == {key: {"text": "a", "turns": 1}}
        assert s.compare_and_set("s", key, {"text": "x", "turns": 1}, {"text": "c"}) is False
        # Values compare as JSON values: key order aside, numbers by value, true is no number.
        assert s.compare_and_set("s", key, {"turns": True, "text": "a"}, {"text": "c"}) is False
        assert s.compare_and_set("s", key, {"turns": 1, "text": "a", "x": 1}, {"t": 0}) is False
        assert s.compare_and_set("s", key, {"turns": 1.0, "text": "a"}, {"text": "c"}) is True
        assert s.get_metadata("s") == {key: {"text": "c"}}
        assert s.compare_and_set("s", "other", None, [1, 2.5, None]) is True
        assert s.compare_and_set("s", key, {"text": "c"}, None) is True
        assert s.get_metadata("s") == {"other": [1, 2.5, None]}
        # Big numbers compare exactly (1e23 is not 10**23), NUL and any text compare as text,
        # and an empty list is not an empty object.
        for value, other in [(1e23, 10**23), (2**60, 2**60 + 1), ("a\x00b", "a\x00c"), ([], {})]:
            assert s.compare_and_set("s", "n", None, value) is True
            assert s.compare_and_set("s", "n", other, "changed") is False
            assert s.compare_and_set("s", "n", value, None) is True
        assert dict(s.tail("s", None).metadata) == {"other": [1, 2.5, None]}

    def test_compare_and_set_that_fails_changes_nothing(self) -> None:
        s = self.open()
        s.append("s", [U1])
        self.clock.advance(5)
        before = (s.list_sessions(), s.get_metadata("s"))
        assert s.compare_and_set("s", "k", "not there", 1) is False
        assert s.compare_and_set("missing", "k", "not there", 1) is False
        assert (s.list_sessions(), s.get_metadata("s")) == before
        assert s.compare_and_set("s", "k", None, 1) is True
        [info] = s.list_sessions()
        assert info.updated_at == T0 + 5, "a successful compare_and_set is a write"
        assert s.compare_and_set("new", "k", None, "v") is True
        assert s.get_metadata("new") == {"k": "v"}

    def test_update_metadata_refuses_reserved_keys(self) -> None:
        s = self.open()
        s.compare_and_set("s", "zerda.summary", None, {"text": "kept"})
        for values in ({"zerda.summary": "x"}, {"ok": 1, "zerda.other": None}):
            with pytest.raises(ConfigurationError, match="reserved"):
                s.update_metadata("s", values)
        s.update_metadata("s", {"zerda": "fine", "zerda_x": 1, "my.zerda.key": 2})
        assert s.get_metadata("s") == {
            "zerda.summary": {"text": "kept"},
            "zerda": "fine",
            "zerda_x": 1,
            "my.zerda.key": 2,
        }

    @pytest.mark.parametrize("bad", ["key", "expected", "value"])
    def test_compare_and_set_refuses_what_is_not_json(self, bad: str) -> None:
        s = self.open()
        s.update_metadata("s", {"k": 1})
        args: dict[str, Any] = {"key": "k", "expected": 1, "value": 2}
        args[bad] = 5 if bad == "key" else float("nan")
        with pytest.raises(ConfigurationError):
            s.compare_and_set("s", args["key"], args["expected"], args["value"])
        assert s.get_metadata("s") == {"k": 1}

    def test_processes_compare_and_set_never_lose_an_increment(self) -> None:
        if not self.supports_processes:
            pytest.skip(f"{type(self).__name__} does not support several processes")
        s = self.open()
        recipe = self.reopen_recipe(self.raw(s))
        assert recipe is not None, "supports_processes needs reopen_recipe"
        processes, increments = 4, 50
        run_processes(
            process_incrementer,
            [(recipe, self.use_async, increments) for _ in range(processes)],
        )
        assert s.get_metadata("counter")["zerda.n"] == processes * increments

    # -- hostile input: Zerda errors, the same on every store -------------------------------------

    @pytest.mark.parametrize(
        "value",
        [
            pytest.param("a\ud800b", id="lone-surrogate"),
            pytest.param({"a\udfffb": 1}, id="surrogate-key"),
            pytest.param(nested(5000), id="nested-5000"),
            pytest.param(nested(65), id="nested-65"),
            pytest.param(10**5000, id="5000-digit-int"),
            pytest.param(float("-inf"), id="minus-inf"),
        ],
    )
    def test_hostile_metadata_gets_a_zerda_error(self, value: Any) -> None:
        s = self.open()
        s.update_metadata("s", {"kept": True})
        for session_id in ("s", "fresh"):
            with pytest.raises(ConfigurationError):
                s.update_metadata(session_id, {"k": value})
            with pytest.raises(ConfigurationError):
                s.compare_and_set(session_id, "k", None, value)
        assert s.get_metadata("s") == {"kept": True}
        assert [i.session_id for i in s.list_sessions()] == ["s"]

    def test_metadata_round_trips_exactly(self) -> None:
        """Floats stay floats, big ints stay exact, any Unicode and NUL stay as they were: in
        session metadata, in a tail's, and in a message's."""
        s = self.open()
        values = {
            "float16": 1e16,
            "float300": 1e300,
            "tiny": 5e-324,
            "neg_zero": -0.0,
            "big": 10**40,
            "negative_big": -(2**70),
            "text": "nul \x00 🦊 \u2028 end",
            "nested": {"f": 1e16, "list": [1.0, 2, 1e-7]},
            "deep": nested(63),
        }
        s.update_metadata("s", values)
        m = user("q", metadata=values)
        s.append("s", [m])
        for got in (s.get_metadata("s"), dict(s.tail("s", None).metadata)):
            assert canonical(got) == canonical(values)
        [stored] = s.history("s")
        assert canonical(dict(stored.metadata)) == canonical(values)
        assert s.compare_and_set("s", "float16", 1e16, 2e16) is True
        assert s.compare_and_set("s", "big", 10**40, 10**41) is True
        assert canonical(s.get_metadata("s")["big"]) == canonical(10**41)

    # -- tails ------------------------------------------------------------------------------------

    @pytest.mark.parametrize("turns", [None, 0, 1, 2, 3, RICH_TURNS, RICH_TURNS + 5])
    def test_tail_of_rich_conversation(self, turns: int | None) -> None:
        s = self.open()
        log = self.append_all(s, "s", RICH_BATCHES)
        for counter in (None, "x", "y", "never-used"):
            assert_tail(s.tail("s", turns, counter), model_tail(log, turns, counter))

    def test_tail_shapes_spelled_out(self) -> None:
        # The model above, checked once against the conversation written out by hand.
        s = self.open()
        self.append_all(s, "s", RICH_BATCHES)
        tail = s.tail("s", 2, "x")
        assert list(tail.system) == [S0, S1, S2]
        assert list(tail.messages) == [U3, U4, A4]
        assert list(tail.turn_starts) == [0, 1]
        assert list(tail.tokens) == [None, 51, 52]
        assert list(tail.system_tokens) == [7, 32, 53]
        tail = s.tail("s", 4)
        assert list(tail.messages) == [U1, CALLS, R1, R2, A1, U2, A2, U3, U4, A4]
        assert list(tail.turn_starts) == [0, 5, 7, 8]
        assert (tail.total_turns, tail.total_messages) == (5, 14)
        assert not tail.complete
        tail = s.tail("s", None)
        assert list(tail.messages[:2]) == [GREET, U1]
        assert list(tail.turn_starts) == [0, 1, 6, 8, 9]
        assert tail.complete

    def test_opening_greeting_is_a_turn_across_batches(self) -> None:
        s = self.open()
        hello, more, q, a = assistant("Hi!"), assistant("Ask me."), user("q"), assistant("a")
        s.append("s", [S0])
        s.append("s", [hello])
        s.append("s", [more])  # continues the greeting turn: it is not a user message
        s.append("s", [q, a])
        tail = s.tail("s", None)
        assert list(tail.messages) == [hello, more, q, a]
        assert list(tail.turn_starts) == [0, 2]
        assert tail.total_turns == 2
        assert list(s.tail("s", 1).messages) == [q, a]

    def test_session_of_system_messages_only(self) -> None:
        s = self.open()
        s.append("s", [S0, S1], {"x": [1, 2]})
        tail = s.tail("s", None, "x")
        assert list(tail.system) == [S0, S1]
        assert list(tail.messages) == []
        assert (tail.total_turns, tail.total_messages) == (0, 2)
        assert list(tail.system_tokens) == [1, 2]
        assert tail.complete

    def test_totals_follow_appends(self) -> None:
        s = self.open()
        log: list[Entry] = []
        for batch, tokens in RICH_BATCHES:
            s.append("s", batch, tokens)
            log += entries(batch, tokens)
            expected = model_tail(log, 1, None)
            tail = s.tail("s", 1)
            assert (tail.total_turns, tail.total_messages) == (
                expected.total_turns,
                expected.total_messages,
            )
            assert tail.total_messages == len(s.history("s"))

    def test_long_session_tail(self) -> None:
        s = self.open()
        log: list[Entry] = []
        for t in range(300):
            batch = [user(f"q{t}"), assistant(f"a{t}")]
            if t % 50 == 0:
                batch.insert(1, system(f"note {t}"))
            tokens = {"x": [t * 10 + i for i in range(len(batch))]}
            s.append("s", batch, tokens)
            log += entries(batch, tokens)
        for turns in (1, 7, 299, 300, None):
            assert_tail(s.tail("s", turns, "x"), model_tail(log, turns, "x"))

    # -- what is stored comes back --------------------------------------------------------------

    def test_history_round_trip(self) -> None:
        s = self.open()
        odd = [
            user("quotes ' \" ` and \\ backslash; -- not SQL", name="alice"),
            assistant("unicode: 🦊 ünïcödé 中文 עברית\nnew line\ttab \x00 nul"),
            assistant(
                "",
                tool_calls=(ToolCall("c1", "search", '{"q": "x", "n": [1, 2]}'),),
                metadata={"model": "gpt", "nested": {"a": [1, 2.5, None, True]}, "": ""},
            ),
            tool('{"result": "ok"}', "c1"),
            Message(Role.ASSISTANT, "no created_at"),
            msg("user", "precise", created_at=1_700_000_000.1234567),
            msg("user", "integral", created_at=0),
            system("pinned", metadata={"source": "config"}),
        ]
        sent = [*RICH_LOG_MESSAGES, *odd]
        s.append("s", sent[:5])
        s.append("s", sent[5:])
        got = s.history("s")
        assert got == sent
        for a, b in zip(got, sent, strict=True):
            assert dict(a.metadata) == dict(b.metadata)
            assert a.created_at == b.created_at
            assert a.tool_calls == b.tool_calls

    def test_token_counts_round_trip(self) -> None:
        s = self.open()
        log = self.append_all(
            s,
            "s",
            [
                ([S0, U1], {"a": [5, 6], "b": [50, 60]}),
                ([CALLS, R1, R2, A1], {"a": [7, 8, 9, 10]}),
                ([U2, S1, A2], None),
                ([U3, S2], {"b": [0, 2**40]}),  # zero and large counts too
            ],
        )
        for counter in ("a", "b", "c"):
            for turns in (None, 1, 2):
                assert_tail(s.tail("s", turns, counter), model_tail(log, turns, counter))
        tail = s.tail("s", None, "b")
        assert list(tail.tokens) == [60, None, None, None, None, None, None, 0]
        assert list(tail.system_tokens) == [50, None, 2**40]

    def test_no_counter_gives_no_counts(self) -> None:
        s = self.open()
        s.append("s", [S0, U1, A1], {"a": [1, 2, 3]})
        tail = s.tail("s", None)
        assert len(tail.tokens) == 0
        assert len(tail.system_tokens) == 0

    def test_reads_are_copies(self) -> None:
        s = self.open()
        s.append("s", [S0, U1, A1], {"a": [1, 2, 3]})
        s.update_metadata("s", {"nested": {"list": [1]}})
        history = s.history("s")
        history.clear()
        metadata = s.get_metadata("s")
        metadata["nested"]["list"].append(2)
        metadata["new"] = 1
        tail = s.tail("s", None, "a")
        if isinstance(tail.messages, list):
            tail.messages.clear()
        if isinstance(tail.tokens, list):
            tail.tokens.clear()
        assert s.history("s") == [S0, U1, A1]
        assert s.get_metadata("s") == {"nested": {"list": [1]}}
        assert list(s.tail("s", None, "a").tokens) == [2, 3]

    # -- metadata ---------------------------------------------------------------------------------

    def test_metadata_merges_and_none_deletes(self) -> None:
        s = self.open()
        assert s.get_metadata("s") == {}
        s.update_metadata("s", {"summary": "so far", "watermark": 3, "keep": [1, {"a": None}]})
        s.update_metadata("s", {"watermark": 5, "summary": None, "missing": None})
        assert s.get_metadata("s") == {"watermark": 5, "keep": [1, {"a": None}]}
        s.append("s", [U1])
        assert s.get_metadata("s") == {"watermark": 5, "keep": [1, {"a": None}]}

    def test_metadata_creates_the_session(self) -> None:
        s = self.open()
        s.update_metadata("m", {"k": "v"})
        [info] = s.list_sessions()
        assert (info.session_id, info.messages, info.turns) == ("m", 0, 0)
        assert (info.created_at, info.updated_at) == (T0, T0)
        assert_empty(s.tail("m", None))
        assert s.history("m") == []

    @pytest.mark.parametrize(
        "values",
        [
            pytest.param({"k": {1, 2}}, id="set"),
            pytest.param({"k": object()}, id="object"),
            pytest.param({"k": float("nan")}, id="nan"),
            pytest.param({"k": float("inf")}, id="inf"),
            pytest.param({1: "v"}, id="int-key"),
            pytest.param([("k", "v")], id="list"),
        ],
    )
    def test_metadata_is_json_only(self, values: Any) -> None:
        s = self.open()
        s.update_metadata("s", {"kept": True})
        for session_id in ("s", "fresh"):
            with pytest.raises(ConfigurationError):
                s.update_metadata(session_id, values)
        assert s.get_metadata("s") == {"kept": True}
        assert [i.session_id for i in s.list_sessions()] == ["s"]

    def test_metadata_is_copied_in(self) -> None:
        s = self.open()
        values: dict[str, Any] = {"list": [1]}
        s.update_metadata("s", values)
        values["list"].append(2)
        values["other"] = 1
        assert s.get_metadata("s") == {"list": [1]}

    # -- listing, deleting, clearing ------------------------------------------------------------

    def test_list_sessions(self) -> None:
        s = self.open()
        ids = ["b", "a.b", "A", "0", "a-b", "a", "z:1"]
        for n, session_id in enumerate(ids):
            s.append(session_id, [user("q")] + [assistant("a")] * n)
            self.clock.advance(1)
        self.clock.advance(0.1)
        s.append("a", [S0, user("again")])
        s.update_metadata("b", {"k": 1})
        listed = s.list_sessions()
        assert [i.session_id for i in listed] == sorted(ids)
        by_id = {i.session_id: i for i in listed}
        for n, session_id in enumerate(ids):
            info = by_id[session_id]
            assert info.created_at == T0 + n
            assert info.expires_at is None
            if session_id in ("a", "b"):
                assert info.updated_at == T0 + len(ids) + 0.1
            else:
                assert info.updated_at == T0 + n
        assert (by_id["a"].messages, by_id["a"].turns) == (1 + 5 + 2, 2)
        assert (by_id["b"].messages, by_id["b"].turns) == (1, 1)
        assert (by_id["z:1"].messages, by_id["z:1"].turns) == (7, 1)

    def test_delete_session(self) -> None:
        s = self.open()
        s.append("s", [U1, A1])
        s.append("t", [U2])
        s.update_metadata("s", {"k": 1})
        assert s.delete_session("s") is True
        assert s.delete_session("s") is False
        assert s.history("s") == []
        assert s.get_metadata("s") == {}
        assert_empty(s.tail("s", None))
        assert [i.session_id for i in s.list_sessions()] == ["t"]
        self.clock.advance(3)
        s.append("s", [U3])  # starts a new session
        assert s.history("s") == [U3]
        info = next(i for i in s.list_sessions() if i.session_id == "s")
        assert info.created_at == T0 + 3

    def test_clear(self) -> None:
        s = self.open()
        for session_id in ("a", "b", "c"):
            s.append(session_id, [U1])
            s.update_metadata(session_id, {"k": 1})
        s.clear()
        assert s.list_sessions() == []
        assert s.history("a") == []
        assert s.get_metadata("b") == {}
        s.append("a", [U2])  # still usable
        assert s.history("a") == [U2]

    # -- TTL --------------------------------------------------------------------------------------

    def test_ttl_expired_session_reads_as_absent(self) -> None:
        s = self.open(ttl=10)
        s.append("s", [S0, U1], {"x": [1, 2]})
        s.update_metadata("s", {"k": 1})
        [info] = s.list_sessions()
        assert info.expires_at == T0 + 10
        self.clock.advance(9.5)
        assert s.history("s") == [S0, U1], "alive before its TTL runs out"
        self.clock.advance(0.5)  # exactly updated_at + ttl: expired
        assert s.history("s") == []
        assert_empty(s.tail("s", None, "x"))
        assert s.get_metadata("s") == {}
        assert s.list_sessions() == []
        assert s.delete_session("s") is False

    def test_ttl_list_omits_expired(self) -> None:
        s = self.open(ttl=10)
        s.append("old", [U1])
        self.clock.advance(5)
        s.append("new", [U2])
        self.clock.advance(5)
        [info] = s.list_sessions()
        assert (info.session_id, info.created_at, info.expires_at) == ("new", T0 + 5, T0 + 15)

    def test_ttl_purge_expired_counts(self) -> None:
        s = self.open(ttl=10)
        s.append("a", [U1])
        self.clock.advance(5)
        s.append("b", [U2])
        s.update_metadata("c", {"only": "metadata"})
        self.clock.advance(5)
        assert s.purge_expired() == 1
        assert [i.session_id for i in s.list_sessions()] == ["b", "c"]
        self.clock.advance(5)
        assert s.purge_expired() == 2
        assert s.purge_expired() == 0
        assert s.list_sessions() == []

    def test_ttl_write_after_expiry_starts_fresh(self) -> None:
        s = self.open(ttl=10)
        s.append("s", [S0, U1, A1], {"x": [1, 2, 3]})
        s.update_metadata("s", {"k": 1})
        self.clock.advance(10)
        s.append("s", [U2], {"x": [4]})
        assert s.history("s") == [U2]
        assert_tail(s.tail("s", None, "x"), model_tail(entries([U2], {"x": [4]}), None, "x"))
        assert s.get_metadata("s") == {}
        [info] = s.list_sessions()
        assert (info.created_at, info.updated_at, info.messages) == (T0 + 10, T0 + 10, 1)

    def test_ttl_metadata_write_after_expiry_starts_fresh(self) -> None:
        s = self.open(ttl=10)
        s.append("s", [U1])
        s.update_metadata("s", {"old": 1})
        self.clock.advance(12)
        s.update_metadata("s", {"new": 2})
        assert s.get_metadata("s") == {"new": 2}
        assert s.history("s") == []

    def test_ttl_writes_refresh(self) -> None:
        s = self.open(ttl=10)
        s.append("s", [U1])
        self.clock.advance(6)
        s.append("s", [A1])  # refreshes: now alive until T0 + 16
        self.clock.advance(6)
        assert s.history("s") == [U1, A1]
        s.update_metadata("s", {"k": 1})  # a write too: alive until T0 + 22
        self.clock.advance(9)
        [info] = s.list_sessions()
        assert (info.created_at, info.updated_at, info.expires_at) == (T0, T0 + 12, T0 + 22)
        assert s.history("s") == [U1, A1]
        self.clock.advance(1)
        assert s.history("s") == []

    def test_ttl_reads_do_not_refresh(self) -> None:
        s = self.open(ttl=10)
        s.append("s", [U1])
        for _ in range(3):
            self.clock.advance(3)
            s.history("s")
            s.tail("s", None)
            s.get_metadata("s")
            s.list_sessions()
        self.clock.advance(1)  # T0 + 10
        assert s.history("s") == []

    # -- retention --------------------------------------------------------------------------------

    @pytest.mark.parametrize("keep", [1, 2, 3, 4, 7, 100])
    def test_retention_keeps_last_messages_by_whole_turns(self, keep: int) -> None:
        s = self.open(max_messages=keep)
        full: list[Entry] = []
        batches = [
            *RICH_BATCHES,
            ([user("q5"), assistant("a5"), assistant("a5 bis")], {"x": [61, 62, 63]}),
            ([system("late"), user("q6")], {"x": [71, 72], "y": [73, 74]}),
            ([assistant("a6")], None),
        ]
        for batch, tokens in batches:
            s.append("s", batch, tokens)
            full += entries(batch, tokens)
            kept = model_retention(full, keep)
            history = s.history("s")
            # The properties first, for readable failures; then the exact expectation.
            systems = [e.message for e in full if e.message.role in PINNED]
            assert [m for m in history if m.role in PINNED] == systems, "systems kept"
            non_system = [m for m in history if m.role not in PINNED]
            full_non_system = [e.message for e in full if e.message.role not in PINNED]
            assert non_system == full_non_system[len(full_non_system) - len(non_system) :]
            assert history == [e.message for e in kept]
            assert len(history) >= min(keep, len(full))
            for counter in ("x", "y", None):
                for turns in (None, 1, 2):
                    assert_tail(s.tail("s", turns, counter), model_tail(kept, turns, counter))
            [info] = s.list_sessions()
            assert info.messages == len(history)
            assert info.turns == len(turns_of(kept))

    def test_retention_in_one_big_batch(self) -> None:
        s = self.open(max_messages=5)
        full = [e for batch, tokens in RICH_BATCHES for e in entries(batch, tokens)]
        s.append("s", [e.message for e in full])
        kept = model_retention(full, 5)
        assert s.history("s") == [e.message for e in kept]
        assert s.history("s") == [S0, U2, S1, A2, U3, U4, A4, S2]

    def test_retention_first_turn_larger_than_limit(self) -> None:
        s = self.open(max_messages=2)
        turn = [user("q"), *(assistant(f"step {i}") for i in range(5))]
        s.append("s", turn)
        assert s.history("s") == turn, "a whole turn is never split"
        nxt = [user("q2"), assistant("a2")]
        s.append("s", nxt)
        assert s.history("s") == nxt

    # -- session ids ------------------------------------------------------------------------------

    @pytest.mark.parametrize("session_id", INVALID_IDS)
    def test_invalid_session_id_is_refused(self, session_id: Any) -> None:
        s = self.open()
        s.append("ok", [U1], {"x": [1]})
        before = s.list_sessions()
        calls: list[Callable[[], object]] = [
            lambda: s.append(session_id, [U2]),
            lambda: s.append(session_id, [U2], {"x": [1]}),
            lambda: s.tail(session_id, None),
            lambda: s.tail(session_id, 1, "x"),
            lambda: s.history(session_id),
            lambda: s.get_metadata(session_id),
            lambda: s.update_metadata(session_id, {"k": "v"}),
            lambda: s.delete_session(session_id),
        ]
        for i, call in enumerate(calls):
            with pytest.raises(InvalidSessionIdError):
                call()
            assert s.list_sessions() == before, f"call {i} changed the store"
        assert s.history("ok") == [U1]

    @pytest.mark.parametrize("session_id", VALID_IDS)
    def test_valid_session_ids_work(self, session_id: str) -> None:
        s = self.open()
        s.append(session_id, [U1, A1], {"x": [1, 2]})
        s.update_metadata(session_id, {"k": "v"})
        assert s.history(session_id) == [U1, A1]
        assert list(s.tail(session_id, 1, "x").tokens) == [1, 2]
        assert s.get_metadata(session_id) == {"k": "v"}
        assert [i.session_id for i in s.list_sessions()] == [session_id]
        assert s.delete_session(session_id) is True
        assert s.list_sessions() == []

    # -- another store over the same data ----------------------------------------------------------

    def test_reopened_store_sees_everything(self) -> None:
        s = self.open()
        log = self.append_all(s, "s", RICH_BATCHES)
        s.update_metadata("s", {"summary": "so far", "n": [1, 2]})
        self.clock.advance(2.5)
        s.append("t", [U1])
        other = self.reopen(self.raw(s))
        assert other.history("s") == [e.message for e in log]
        for counter in ("x", "y"):
            assert_tail(other.tail("s", None, counter), model_tail(log, None, counter))
        assert other.get_metadata("s") == {"summary": "so far", "n": [1, 2]}
        assert other.list_sessions() == s.list_sessions()

    def test_tail_since_gives_what_came_after_a_cursor(self) -> None:
        """Optional: a store with ``tail_since`` (its tails carry a cursor) says what a
        session gained after one, exactly what reading the tail again would add, or ``None``
        when anything else changed; a store without it gives no cursor."""
        s = self.open(max_messages=None, ttl=10)
        s.append("s", [system("be brief"), U1, A1], {"x": [1, 2, 3]})
        before = s.tail("s", None, "x")
        if before.cursor is None:
            assert not hasattr(self.raw(s), "tail_since"), "a store with tail_since marks tails"
            pytest.skip(f"{type(self).__name__} offers no tail_since")
        nothing = s.tail_since("s", before.cursor, "x")
        assert (list(nothing.messages), nothing.total_turns, nothing.total_messages) == ([], 1, 3)
        new = [user("and a latte"), assistant("sure"), user("thanks")]
        s.append("s", new[:2], {"x": [4, 5]})
        s.append("s", new[2:])  # counted by no one
        since = s.tail_since("s", nothing.cursor, "x")
        after = s.tail("s", None, "x")
        assert list(since.messages) == list(after.messages[len(before.messages) :]) == new
        assert list(since.tokens) == [4, 5, None]
        assert list(since.turn_starts) == [0, 2]
        assert (since.total_turns, since.total_messages) == (after.total_turns, 6)
        assert list(s.tail_since("s", since.cursor, "x").messages) == []
        # A pinned message, an edit, a deletion, expiry: read the tail again.
        s.append("s", [system("new rules")])
        assert s.tail_since("s", since.cursor, "x") is None
        cursor = s.tail("s", None).cursor
        s.pop_turn("s")
        assert s.tail_since("s", cursor) is None
        cursor = s.tail("s", None).cursor
        assert s.tail_since("other", cursor) is None
        assert s.tail_since("s", "not a cursor") is None
        assert s.tail_since("s", tuple(str(part) for part in cursor)) is None
        assert s.tail_since("s", (*cursor[:-1], None)) is None
        self.clock.advance(11)
        assert s.tail_since("s", cursor) is None

    def test_two_stores_see_each_others_writes(self) -> None:
        if not self.supports_processes:
            pytest.skip(f"{type(self).__name__} does not share data between stores")
        s = self.open()
        other = self.reopen(self.raw(s))
        s.append("s", [U1], {"x": [1]})
        other.append("s", [A1], {"x": [2]})
        s.update_metadata("s", {"from": "s"})
        other.update_metadata("s", {"other": True})
        for store in (s, other):
            assert store.history("s") == [U1, A1]
            assert list(store.tail("s", None, "x").tokens) == [1, 2]
            assert store.get_metadata("s") == {"from": "s", "other": True}
        assert other.delete_session("s") is True
        assert s.history("s") == []

    def test_processes_append_concurrently(self) -> None:
        if not self.supports_processes:
            pytest.skip(f"{type(self).__name__} does not support several processes")
        writers, batches, size = self.process_writers, self.process_batches, 3
        s = self.open()
        recipe = self.reopen_recipe(self.raw(s))
        assert recipe is not None, "supports_processes needs reopen_recipe"
        run_processes(
            process_writer,
            [(recipe, self.use_async, w, batches, size, "shared") for w in range(writers)],
        )
        history = s.history("shared")
        assert len(history) == writers * batches * size
        tail = s.tail("shared", None, "tag")
        assert tail.total_turns == writers * batches
        check_batches(history, writers, batches, tail.tokens)

    @pytest.mark.parametrize("seed", range(6))
    def test_random_operations_behave_like_the_in_memory_store(self, seed: int) -> None:
        """Random appends, reads, metadata, deletes, clock moves and purges, checked step by
        step against InMemoryStore, the reference."""
        rng = random.Random(seed)
        ttl, max_messages = rng.choice([None, 5.0]), rng.choice([None, 1, 3, 8])
        reference = InMemoryStore(ttl=ttl, max_messages=max_messages, clock=self.clock)
        store = self.open(ttl=ttl, max_messages=max_messages)

        def message(message_id: str | None) -> Message:
            role = rng.choice(
                ["user", "user", "assistant", "assistant", "tool", "system", "developer"]
            )
            if role == "tool":
                return Message(
                    Role.TOOL, f"result {rng.random():.3f}", tool_call_id="c1", id=message_id
                )
            if role == "assistant" and rng.random() < 0.3:
                return Message(
                    Role.ASSISTANT, None, tool_calls=(ToolCall("c1", "f", "{}"),), id=message_id
                )
            text = f"{role} {rng.random():.4f}"
            return Message(Role(role), text, created_at=rng.random(), id=message_id)

        # Ids come from a small pool, so batches often repeat messages already stored: a retry
        # of a whole batch, or a batch that overlaps the log.
        sent: dict[str, Message] = {}

        def batch_of(size: int) -> list[Message]:
            ids = rng.sample(range(40), size)
            out = []
            for n in ids:
                key = f"m{n}"
                if key in sent and rng.random() < 0.5:
                    out.append(sent[key])  # a message sent before, maybe stored
                    continue
                m = message(key if rng.random() < 0.7 else None)
                if m.id is not None:
                    sent[m.id] = m
                out.append(m)
            return out

        for step in range(150):
            sid = rng.choice(["s1", "s2", "s3"])
            op = rng.random()
            where = f"seed {seed} step {step}"
            if op < 0.45:
                batch = batch_of(rng.randint(0, 5))
                tokens = rng.choice(
                    [
                        None,
                        {"c": [rng.randint(1, 9) for _ in batch]},
                        {"c": [1] * len(batch), "e": [2] * len(batch)},
                    ]
                )
                if rng.random() < 0.3:
                    turns, counter = rng.choice([None, 1, 3]), rng.choice([None, "c"])
                    expected_n, expected_tail = reference.append_then_tail(
                        sid, batch, tokens, turns, counter
                    )
                    got_n, got_tail = store.append_then_tail(sid, batch, tokens, turns, counter)
                    assert got_n == expected_n, where
                    assert_same_tail(got_tail, expected_tail)
                else:
                    assert store.append(sid, batch, tokens) == reference.append(
                        sid, batch, tokens
                    ), where
            elif op < 0.7:
                turns, counter = rng.choice([None, 0, 1, 2, 5]), rng.choice([None, "c", "e"])
                expected, got = reference.tail(sid, turns, counter), store.tail(sid, turns, counter)
                assert_same_tail(got, expected)
            elif op < 0.78:
                assert store.history(sid) == reference.history(sid), where
            elif op < 0.8:
                values = {"k": rng.randint(0, 3), "z": rng.choice([None, 1])}
                reference.update_metadata(sid, values)
                store.update_metadata(sid, values)
                assert store.get_metadata(sid) == reference.get_metadata(sid), where
            elif op < 0.83:
                key = rng.choice(["zerda.k", "k"])
                expected_value = rng.choice([None, 0, 1, 2])
                value = rng.choice([None, 1, 2, {"t": rng.randint(0, 2)}])
                assert store.compare_and_set(
                    sid, key, expected_value, value
                ) == reference.compare_and_set(sid, key, expected_value, value), where
                assert store.get_metadata(sid) == reference.get_metadata(sid), where
            elif op < 0.86:
                assert store.delete_session(sid) == reference.delete_session(sid), where
            elif op < 0.9:
                self.clock.advance(rng.choice([1, 3, 6]))
            elif op < 0.93:
                assert store.purge_expired() == reference.purge_expired(), where
            elif op < 0.95:
                reference.clear()
                store.clear()
            elif op < 0.96:
                assert store.list_sessions() == reference.list_sessions(), where
            else:
                self._random_edit(rng, store, reference, sid, where)
        for sid in ("s1", "s2", "s3"):
            assert store.history(sid) == reference.history(sid)
        assert store.list_sessions() == reference.list_sessions()

    @staticmethod
    def _random_edit(
        rng: random.Random, store: Any, reference: InMemoryStore, sid: str, where: str
    ) -> None:
        """One random log edit, on both stores, with the same outcome."""
        held = [m.id for m in reference.history(sid) if m.id is not None]
        some = rng.choice(held) if held and rng.random() < 0.8 else "m99"
        kind = rng.choice(["delete", "pop", "fork", "edit"])
        if kind == "delete":
            ids = [*rng.sample(held, min(len(held), rng.randint(0, 2))), "m98"]
            assert store.delete_messages(sid, ids) == reference.delete_messages(sid, ids), where
        elif kind == "pop":
            assert store.pop_turn(sid) == reference.pop_turn(sid), where
        else:
            outcomes = []
            target, at = rng.choice(["s1", "s2", "s3", "s4"]), rng.choice([None, some])
            for s in (reference, store):
                try:
                    if kind == "fork":
                        s.delete_session("s4")
                        outcomes.append(s.fork(sid, target, at))
                    else:
                        outcomes.append(s.edit_message(sid, some, f"edited {where}"))
                except (MessageNotFoundError, SessionExistsError, InvalidMessageError) as exc:
                    outcomes.append(type(exc).__name__)
            assert outcomes[1] == outcomes[0], where
        for other in ("s1", "s2", "s3", "s4"):
            assert store.history(other) == reference.history(other), where


class StoreContract(_Contract):
    """The contract through the sync protocol (:class:`zerda.stores.Store`)."""

    use_async = False

    def test_threads_compare_and_set_never_lose_an_increment(self) -> None:
        s = self.open()
        threads, increments = 6, 40
        errors: list[BaseException] = []
        barrier = threading.Barrier(threads)

        def work() -> None:
            try:
                barrier.wait()
                for _ in range(increments):
                    cas_increment(s, "counter")
            except BaseException as exc:
                errors.append(exc)

        workers = [threading.Thread(target=work) for _ in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        assert not errors, errors[0]
        assert s.get_metadata("counter")["zerda.n"] == threads * increments

    def test_threads_append_concurrently(self) -> None:
        writers, batches = 8, 100
        s = self.open()
        barrier = threading.Barrier(writers + 1)
        errors: list[BaseException] = []
        done = threading.Event()
        reads = [0]

        def write(w: int) -> None:
            try:
                barrier.wait()
                for b in range(batches):
                    size = thread_batch_size(b)
                    s.append("shared", tagged_batch(w, b, size), tagged_tokens(w, b, size))
            except BaseException as exc:
                errors.append(exc)

        def read() -> None:
            # Reads while the writers run must never see half a batch.
            try:
                barrier.wait()
                while True:
                    finished = done.is_set()
                    problem = check_whole_turns(s.tail("shared", 3))
                    assert problem is None, problem
                    reads[0] += 1
                    if finished:
                        return
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
        reader = threading.Thread(target=read)
        for t in [*threads, reader]:
            t.start()
        for t in threads:
            t.join()
        done.set()
        reader.join()
        assert not errors, errors[0]
        assert reads[0] >= 1
        history = s.history("shared")
        expected = sum(thread_batch_size(b) for b in range(batches)) * writers
        assert len(history) == expected
        tail = s.tail("shared", None, "tag")
        assert tail.total_turns == writers * batches
        check_batches(history, writers, batches, tail.tokens)

    def test_tasks_append_concurrently(self) -> None:
        """Through the async protocol when the store has it, else through a memory's async
        methods (which run a sync store's calls in worker threads)."""
        writers, batches = 8, 100
        store = self.open_raw()
        native = isinstance(store, AsyncStore)

        async def write(w: int) -> None:
            memory = ConversationBufferMemory(store=store, session_id="shared")
            for b in range(batches):
                size = thread_batch_size(b)
                batch = tagged_batch(w, b, size)
                if native:
                    await store.aappend("shared", batch, tagged_tokens(w, b, size))
                else:
                    await memory.aadd_messages(batch)

        async def main() -> None:
            await asyncio.gather(*(write(w) for w in range(writers)))

        asyncio.run(main())
        history = store.history("shared")
        tokens = store.tail("shared", None, "tag").tokens
        if not native:  # the memory stores no counts; check the order and wholeness alone
            tokens = [tag_count(*_parse(m)[:3]) for m in history]
        check_batches(history, writers, batches, tokens)

    def test_threads_deleting_and_popping_never_lose_an_append(self) -> None:
        """Writers append turns while others delete some of what is stored and pop turns:
        every appended message ends up stored, deleted on purpose, or returned by a pop."""
        s = self.open()
        writers, turns = 4, 40
        deleted: set[str] = set()
        popped: list[Message] = []
        errors: list[BaseException] = []
        writing = threading.Event()
        barrier = threading.Barrier(writers + 2)

        def write(w: int) -> None:
            try:
                barrier.wait()
                for t in range(turns):
                    s.append(
                        "race",
                        [
                            user(f"q {w} {t}", id=f"u{w}-{t}"),
                            assistant(f"a {w} {t}", id=f"a{w}-{t}"),
                        ],
                    )
            except BaseException as exc:
                errors.append(exc)

        def delete() -> None:
            try:
                barrier.wait()
                while writing.is_set():
                    answers = [m.id for m in s.history("race") if m.role is Role.ASSISTANT]
                    victims = [i for i in answers[::3] if i is not None]
                    s.delete_messages("race", victims)
                    deleted.update(victims)
            except BaseException as exc:
                errors.append(exc)

        def pop() -> None:
            try:
                barrier.wait()
                while writing.is_set():
                    popped.extend(s.pop_turn("race"))
            except BaseException as exc:
                errors.append(exc)

        writing.set()
        threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
        others = [threading.Thread(target=delete), threading.Thread(target=pop)]
        for t in [*threads, *others]:
            t.start()
        for t in threads:
            t.join()
        writing.clear()
        for t in others:
            t.join()
        assert not errors, errors[0]
        stored = {m.id for m in s.history("race")}
        popped_ids = {m.id for m in popped}
        assert len(popped_ids) == len(popped), "a message popped twice"
        for w in range(writers):
            for t in range(turns):
                for ident in (f"u{w}-{t}", f"a{w}-{t}"):
                    assert ident in stored or ident in deleted or ident in popped_ids, ident
        assert not (stored & popped_ids), "a popped message is still stored"


class AsyncStoreContract(_Contract):
    """The contract through the async protocol (:class:`zerda.stores.AsyncStore`)."""

    use_async = True

    def test_tasks_deleting_and_popping_never_lose_an_append(self) -> None:
        store = self.open_raw()
        writers, turns = 4, 30
        deleted: set[str] = set()
        popped: list[Message] = []

        async def write(w: int) -> None:
            for t in range(turns):
                await store.aappend(
                    "race",
                    [user(f"q {w} {t}", id=f"u{w}-{t}"), assistant(f"a {w} {t}", id=f"a{w}-{t}")],
                )

        async def edit(writing: asyncio.Future[Any]) -> None:
            while not writing.done():
                answers = [m.id for m in await store.ahistory("race") if m.role is Role.ASSISTANT]
                victims = [i for i in answers[::3] if i is not None]
                await store.adelete_messages("race", victims)
                deleted.update(victims)
                popped.extend(await store.apop_turn("race"))
                await asyncio.sleep(0)  # an in-process store never waits: let the writers in

        async def main() -> None:
            writing = asyncio.gather(*(write(w) for w in range(writers)))
            await asyncio.gather(writing, edit(writing))

        self._loop.run_until_complete(main())
        stored = {m.id for m in self._loop.run_until_complete(store.ahistory("race"))}
        popped_ids = {m.id for m in popped}
        for w in range(writers):
            for t in range(turns):
                for ident in (f"u{w}-{t}", f"a{w}-{t}"):
                    assert ident in stored or ident in deleted or ident in popped_ids, ident
        assert not (stored & popped_ids)

    def test_tasks_compare_and_set_never_lose_an_increment(self) -> None:
        store = self.open_raw()
        tasks, increments = 6, 40

        async def work() -> None:
            for _ in range(increments):
                while True:
                    current = (await store.aget_metadata("counter")).get("zerda.n")
                    if await store.acompare_and_set(
                        "counter", "zerda.n", current, (current or 0) + 1
                    ):
                        break

        async def main() -> None:
            await asyncio.gather(*(work() for _ in range(tasks)))

        self._loop.run_until_complete(main())
        metadata = self._loop.run_until_complete(store.aget_metadata("counter"))
        assert metadata["zerda.n"] == tasks * increments

    def test_tasks_append_concurrently(self) -> None:
        writers, batches = 8, 100
        store = self.open_raw()
        problems: list[str] = []

        async def write(w: int) -> None:
            for b in range(batches):
                size = thread_batch_size(b)
                await store.aappend("shared", tagged_batch(w, b, size), tagged_tokens(w, b, size))

        async def read(writing: asyncio.Future[Any]) -> int:
            reads = 0
            while True:
                finished = writing.done()
                problem = check_whole_turns(await store.atail("shared", 3))
                if problem is not None:
                    problems.append(problem)
                reads += 1
                if finished:
                    return reads
                await asyncio.sleep(0)  # yield to the writers; not a synchronisation wait

        async def main() -> int:
            writing = asyncio.gather(*(write(w) for w in range(writers)))
            reads = await read(writing)
            await writing
            return reads

        assert self._loop.run_until_complete(main()) >= 1
        assert not problems, problems[0]
        history = self._loop.run_until_complete(store.ahistory("shared"))
        tail = self._loop.run_until_complete(store.atail("shared", None, "tag"))
        assert tail.total_turns == writers * batches
        check_batches(history, writers, batches, tail.tokens)

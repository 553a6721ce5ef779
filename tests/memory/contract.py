"""The memory contract suite: what every memory kind does over every store, sync and async.

A backend opts in by subclassing ``MemoryContract`` (a sync ``Store``) or
``AsyncMemoryContract`` (an ``AsyncStore``) in a module of ``tests/memory/`` whose class name
starts with ``Test``, and saying how to make a store::

    class TestSQLite(MemoryContract):
        supports_processes = True  # optional: the spawned-process tests

        def make_store(self):
            return SQLiteStore(self.tmp_path / "memory.db")  # the same data at every call

        def store_recipe(self):
            # ("module:Class", picklable kwargs): how a spawned process opens the same data.
            return "zerda.stores:SQLiteStore", {"path": str(self.tmp_path / "memory.db")}

``make_store`` is called for every worker, restart and check; each call must reach the same
data (for an in-memory store, return the same object). Every test runs for each memory kind:
buffer, window, token, summary buffer and summary. What a test expects is computed here, from
the contract, never read from a memory.

The summary kinds fold with :class:`TaggingSummarizer`, whose summary lists the tag of every
turn it folded, so that each turn's fate can be read back: folded once, or in the context
verbatim; never both, never neither, never folded twice.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import itertools
import re
import threading
import time
from collections import Counter
from collections.abc import Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pytest

from _conversations import scan_turns
from _processes import run_processes
from zerda.memory import (
    BaseMemory,
    ConversationBufferMemory,
    ConversationBufferWindowMemory,
    ConversationSummaryBufferMemory,
    ConversationSummaryMemory,
    ConversationTokenBufferMemory,
)
from zerda.memory._summary import DEFAULT_PREFIX
from zerda.messages import Message, Role, ToolCall
from zerda.tokens import CallableCounter

__all__ = ["KINDS", "AsyncMemoryContract", "MemoryContract", "TaggingSummarizer"]

T = TypeVar("T")
Recipe = tuple[str, dict[str, Any]]

KINDS = ("buffer", "window", "token", "summary_buffer", "summary")
SUMMARY_KINDS = ("summary_buffer", "summary")
WINDOW = 3
BUDGET = 80
_TAG = re.compile(r"\[(w\d+t\d+)\]")


def contract_tokens(text: str) -> int:
    """A counter that charges the summary a flat 8 tokens, whatever it lists, so that it never
    crowds turns out of the budget however many it folds; any other text, a token a word."""
    return 8 if text.startswith(DEFAULT_PREFIX) else len(text.split())


COUNTER = CallableCounter(contract_tokens, name="memory-contract")


class TaggingSummarizer:
    """Folds turns into a summary that lists each folded turn's tag, one a line, in order.

    It takes a few milliseconds, as a model would take seconds: long enough for workers that
    fold one session at once to overlap, which is the race the memories must settle.
    """

    seconds = 0.003

    def summarize(self, previous_summary: str, messages: Sequence[Message]) -> str:
        time.sleep(self.seconds)
        return self._fold(previous_summary, messages)

    async def asummarize(self, previous_summary: str, messages: Sequence[Message]) -> str:
        await asyncio.sleep(self.seconds)
        return self._fold(previous_summary, messages)

    @staticmethod
    def _fold(previous_summary: str, messages: Sequence[Message]) -> str:
        tags = [f"[{t}]" for m in messages if m.role is Role.USER for t in _TAG.findall(m.text)]
        return "\n".join([previous_summary, *tags] if previous_summary else tags)


def make_memory(kind: str, store: Any, session_id: str) -> BaseMemory:
    """A memory of ``kind`` over ``store``: what every test and worker process uses."""
    options: dict[str, Any] = {"store": store, "session_id": session_id}
    if kind == "buffer":
        return ConversationBufferMemory(**options)
    if kind == "window":
        return ConversationBufferWindowMemory(k=WINDOW, **options)
    if kind == "token":
        return ConversationTokenBufferMemory(BUDGET, token_counter=COUNTER, **options)
    if kind == "summary_buffer":
        return ConversationSummaryBufferMemory(
            BUDGET, summarizer=TaggingSummarizer(), token_counter=COUNTER, **options
        )
    if kind == "summary":
        return ConversationSummaryMemory(
            summarizer=TaggingSummarizer(), token_counter=COUNTER, **options
        )
    raise AssertionError(f"unknown kind {kind!r}")


def tagged_turn(writer: int, index: int) -> list[Message]:
    """One turn tagged ``[w<writer>t<index>]``; every third calls a tool and gets its result."""
    tag = f"[w{writer}t{index}]"
    turn = [Message(Role.USER, f"{tag} what next for order {index}?")]
    if index % 3 == 1:
        call = ToolCall(f"c{writer}-{index}", "lookup", f'{{"order": {index}}}')
        turn.append(Message(Role.ASSISTANT, None, tool_calls=(call,)))
        turn.append(Message(Role.TOOL, f"order {index} found", tool_call_id=call.id))
    turn.append(Message(Role.ASSISTANT, f"order {index} is on its way"))
    return turn


def tag_of(turn: Sequence[Message]) -> str:
    [tag] = _TAG.findall(turn[0].text)
    return tag


def summary_tags(context: Sequence[Message]) -> list[str]:
    """The tags the summary in ``context`` lists (with repeats: a turn folded twice shows)."""
    return [
        tag
        for m in context
        if m.role is Role.SYSTEM and m.text.startswith(DEFAULT_PREFIX)
        for tag in _TAG.findall(m.text)
    ]


def context_tags(context: Sequence[Message]) -> list[str]:
    """The tags of the turns the context holds verbatim."""
    return [tag for m in context if m.role is Role.USER for tag in _TAG.findall(m.text)]


def check_fates(history: Sequence[Message], context: Sequence[Message], done: bool) -> None:
    """Each turn of ``history`` is in the summary once or in the context, never both; no
    turn is folded twice. With ``done`` (no write in flight, folds flushed) never neither."""
    stored = [tag_of(t) for t in scan_turns(list(history))]
    folded, shown = summary_tags(context), context_tags(context)
    twice = [tag for tag, n in Counter(folded).items() if n > 1]
    assert not twice, f"turns folded twice: {twice}"
    both = set(folded) & set(shown)
    assert not both, f"turns both in the summary and verbatim: {sorted(both)}"
    assert set(folded) | set(shown) <= set(stored), "a tag nobody stored"
    if done:
        lost = set(stored) - set(folded) - set(shown)
        assert not lost, f"{len(lost)} turns neither folded nor in the context: {sorted(lost)}"
    # The summary folds turns in order: what it lists is the oldest turns, oldest first.
    assert folded == stored[: len(folded)], "the summary does not hold the oldest turns in order"


def _load(target: str) -> Any:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def memory_worker(
    recipe: Recipe,
    use_async: bool,
    kind: str,
    writer: int,
    turns: int,
    session_id: str,
    barrier: Any,
) -> None:
    """One worker process: a memory of its own over the shared store, recording its turns."""
    target, kwargs = recipe
    store = _load(target)(**kwargs)
    memory = make_memory(kind, store, session_id)

    if use_async:

        async def main() -> None:
            barrier.wait(60)
            for i in range(turns):
                await memory.aadd_messages(tagged_turn(writer, i))
            await store.aclose()

        asyncio.run(main())
        return
    barrier.wait(60)
    for i in range(turns):
        memory.add_messages(tagged_turn(writer, i))
    store.close()


class _Face:
    """The memory methods the tests use, through the sync API or the async twins."""

    def __init__(self, memory: BaseMemory, loop: asyncio.AbstractEventLoop | None) -> None:
        self.memory = memory
        self._loop = loop

    def _call(self, name: str, *args: Any) -> Any:
        if self._loop is None:
            return getattr(self.memory, name)(*args)
        coro: Coroutine[Any, Any, Any] = getattr(self.memory, "a" + name)(*args)
        return self._loop.run_until_complete(coro)

    def add_message(self, message: Any) -> Message:
        result: Message = self._call("add_message", message)
        return result

    def add_messages(self, messages: Sequence[Any]) -> list[Message]:
        result: list[Message] = self._call("add_messages", messages)
        return result

    def get_context(self) -> list[Message]:
        result: list[Message] = self._call("get_context")
        return result

    def get_history(self) -> list[Message]:
        result: list[Message] = self._call("get_history")
        return result

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("get_memory_stats")
        return result

    def flush(self) -> None:
        if isinstance(self.memory, ConversationSummaryBufferMemory):
            self._call("flush")

    def pop_turn(self) -> Any:
        return self._call("pop_turn")

    def delete_messages(self, ids: Sequence[str]) -> int:
        result: int = self._call("delete_messages", ids)
        return result

    def edit_message(self, message_id: str, content: str) -> Message:
        result: Message = self._call("edit_message", message_id, content)
        return result

    def fork(self, new_session_id: str, at: str | None) -> _Face:
        return _Face(self._call("fork", new_session_id, at), self._loop)


class _Contract:
    """The tests both APIs share."""

    use_async: ClassVar[bool] = False
    supports_processes: ClassVar[bool] = False
    tmp_path: Path

    def make_store(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define make_store()")

    def store_recipe(self) -> Recipe | None:
        return None

    # -- plumbing ---------------------------------------------------------------------------

    @pytest.fixture(params=KINDS, autouse=True)
    def _contract_env(self, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[None]:
        self.kind: str = request.param
        self.tmp_path = tmp_path
        self._sessions = itertools.count()
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

    def store(self) -> Any:
        store = self.make_store()
        if inspect.isawaitable(store):
            store = self._loop.run_until_complete(store)
        if store not in self._stores:
            self._stores.append(store)
        return store

    def memory(self, session_id: str = "s", store: Any = None) -> _Face:
        memory = make_memory(self.kind, self.store() if store is None else store, session_id)
        return _Face(memory, self._loop if self.use_async else None)

    @property
    def summarizes(self) -> bool:
        return self.kind in SUMMARY_KINDS

    def check_context(self, face: _Face, history: Sequence[Message]) -> list[Message]:
        """The context ``face`` gives for ``history``, checked against the contract."""
        context = face.get_context()
        systems = [m for m in history if m.role is Role.SYSTEM]
        assert context[: len(systems)] == systems, "pinned system messages first, in order"
        rest = context[len(systems) :]
        if self.summarizes and rest and rest[0].role is Role.SYSTEM:
            rest = rest[1:]  # the summary, checked by check_fates
        turns = scan_turns([m for m in history if m.role is not Role.SYSTEM])
        kept = scan_turns(rest)
        assert kept == turns[len(turns) - len(kept) :], "the newest whole turns, as stored"
        if self.kind == "buffer":
            assert len(kept) == len(turns)
        elif self.kind == "window":
            assert len(kept) == min(WINDOW, len(turns))
        elif self.kind != "summary":
            assert COUNTER.count_messages(context) <= BUDGET
            if len(kept) < len(turns) and not self.summarizes:
                older = turns[len(turns) - len(kept) - 1]
                assert COUNTER.count_messages([*context, *older]) > BUDGET, "a turn fitted"
        if self.summarizes:
            check_fates(history, context, done=True)
        return context

    # -- ordering -------------------------------------------------------------------------------

    def test_what_is_added_is_what_is_stored_in_order(self) -> None:
        face = self.memory()
        system = Message(Role.SYSTEM, "You take orders.")
        sent: list[Message] = [*face.add_messages([system, *tagged_turn(0, 0)])]
        for i in range(1, 6):
            turn = tagged_turn(0, i)
            if i % 2:
                sent += face.add_messages(turn)
            else:
                sent += [face.add_message(m.to_dict()) for m in turn]
        history = face.get_history()
        assert history == sent
        assert [m.content for m in history] == [
            m.content for m in [system, *itertools.chain(*(tagged_turn(0, i) for i in range(6)))]
        ]
        face.flush()
        self.check_context(face, history)

    def test_every_message_gets_a_time_and_an_id_in_order(self) -> None:
        face = self.memory()
        stored = face.add_messages(tagged_turn(0, 0)) + [
            face.add_message(m) for m in tagged_turn(0, 1)
        ]
        ids = [m.id for m in stored]
        assert all(isinstance(i, str) for i in ids)
        assert len(set(ids)) == len(ids)
        assert ids == sorted(ids), "ids given by one process sort in the order given"
        assert all(m.created_at is not None for m in stored)
        assert [m.id for m in face.get_history()] == ids

    # -- ids: a retry stores nothing twice --------------------------------------------------------

    def test_a_retried_write_is_stored_once(self) -> None:
        face = self.memory()
        batch = face.add_messages(tagged_turn(0, 0))
        single = face.add_message(tagged_turn(0, 1)[0])
        before = face.get_history()
        assert face.add_messages(batch) == batch, "a retry returns the messages as stored"
        assert face.add_message(single) == single
        assert face.get_history() == before
        mine = Message(Role.ASSISTANT, "given an id by the caller", id="caller-1")
        face.add_message(mine)
        face.add_message(mine)
        assert [m.id for m in face.get_history()].count("caller-1") == 1
        face.flush()
        self.check_context(face, face.get_history())

    # -- editing and branching (issue #16) --------------------------------------------------------

    def test_pop_delete_edit_and_fork_leave_no_trace(self) -> None:
        face = self.memory()
        face.add_message(Message(Role.SYSTEM, "You take orders."))
        for i in range(8):
            face.add_messages(tagged_turn(0, i))
        face.flush()
        history = face.get_history()
        turns = scan_turns([m for m in history if m.role is not Role.SYSTEM])
        popped = face.pop_turn()
        assert popped is not None
        assert list(popped.messages) == list(turns[-1])
        # Turn 2 goes whole (a user asks to be forgotten); turn 1's tool call goes with its result.
        assert face.delete_messages([m.id for m in turns[2]]) == len(turns[2])
        call = next(m for m in turns[1] if m.tool_calls)
        assert face.delete_messages([call.id]) == 2
        edited = face.edit_message(turns[3][0].id, "[w0t3] changed my mind")
        assert edited.id == turns[3][0].id
        gone = {m.id for m in (*turns[-1], *turns[2])} | {call.id, turns[1][1].id, turns[1][2].id}
        expected = [edited if m.id == edited.id else m for m in history if m.id not in gone]
        assert face.get_history() == expected
        face.add_messages(tagged_turn(0, 8))  # the next write folds what an edit dropped
        face.flush()
        reads = " ".join(
            [m.text for m in face.get_history()]
            + [m.text for m in face.get_context()]
            + [str(face.stats())]
        )
        assert "[w0t2]" not in reads, "a deleted turn is in no read, summary included"
        assert "[w0t7]" not in reads, "nor a popped one"
        assert "what next for order 3" not in reads
        branch = face.fork("branch", turns[4][0].id)
        now = face.get_history()
        assert branch.get_history() == now[: now.index(turns[4][0]) + 1]
        assert face.get_history() == now, "the source is unchanged"
        assert branch.get_context()[-1] == turns[4][0]

    # -- restart --------------------------------------------------------------------------------

    def test_a_restart_shows_the_same(self) -> None:
        face = self.memory()
        face.add_message(Message(Role.SYSTEM, "You take orders."))
        for i in range(8):
            face.add_messages(tagged_turn(0, i))
        face.flush()
        before = (face.get_history(), face.get_context(), _stable(face.stats()))
        self.restart()
        again = self.memory()
        after = (again.get_history(), again.get_context(), _stable(again.stats()))
        assert after == before
        self.check_context(again, after[0])

    def restart(self) -> None:
        """Close every store; the next ``self.store()`` opens the data again."""
        for store in reversed(self._stores):
            if self.use_async:
                self._loop.run_until_complete(store.aclose())
            else:
                store.close()
        self._stores.clear()

    # -- sessions are apart ---------------------------------------------------------------------

    def test_sessions_do_not_mix(self) -> None:
        a, b = self.memory("a"), self.memory("b")
        for i in range(5):
            a.add_messages(tagged_turn(1, i))
            b.add_messages(tagged_turn(2, i))
        a.flush()
        b.flush()
        for face, writer in ((a, 1), (b, 2)):
            history = face.get_history()
            assert [tag_of(t) for t in scan_turns(history)] == [f"w{writer}t{i}" for i in range(5)]
            self.check_context(face, history)

    # -- many writers on one session -------------------------------------------------------------

    def test_processes_on_one_session_lose_nothing(self) -> None:
        self.run_processes(writers=2, turns=12)

    @pytest.mark.parametrize("writers", [2, 4, 8])
    def test_processes_fold_every_turn_exactly_once(self, writers: int) -> None:
        """The issue's bar: workers folding one session lose no turn and fold none twice."""
        if self.kind != "summary_buffer":
            pytest.skip("folding under many processes: run for the summary buffer memory")
        self.run_processes(writers=writers, turns=20)

    def run_processes(self, writers: int, turns: int) -> None:
        if not self.supports_processes:
            pytest.skip(f"{type(self).__name__} does not share data between processes")
        recipe = self.store_recipe()
        assert recipe is not None, "supports_processes needs store_recipe"
        session_id = f"shared{next(self._sessions)}"
        run_processes(
            memory_worker,
            [(recipe, self.use_async, self.kind, w, turns, session_id) for w in range(writers)],
        )
        self.check_writers(self.memory(session_id), writers, turns)

    def check_writers(self, face: _Face, writers: int, turns: int) -> None:
        """Every writer's turns are stored whole, once each, in the order it wrote them; and
        every turn's fate is sound."""
        history = face.get_history()
        by_writer: dict[int, list[int]] = {w: [] for w in range(writers)}
        for turn in scan_turns(history):
            tag = tag_of(turn)
            writer, index = (int(x) for x in tag[1:].split("t"))
            assert [m.content for m in turn] == [m.content for m in tagged_turn(writer, index)], (
                f"turn {tag} is not whole: {[m.content for m in turn]}"
            )
            by_writer[writer].append(index)
        for writer, indexes in by_writer.items():
            assert indexes == list(range(turns)), f"writer {writer}: turns lost or repeated"
        if self.summarizes:
            check_fates(history, face.get_context(), done=False)
            face.flush()
        self.check_context(face, history)


class MemoryContract(_Contract):
    """The contract through the sync API, over a sync store."""

    def test_threads_on_one_session_lose_nothing(self) -> None:
        writers, turns = 4, 15
        self.store()
        session_id = "threads"
        barrier = threading.Barrier(writers + 1)
        errors: list[BaseException] = []
        done = threading.Event()

        def write(w: int) -> None:
            try:
                face = self.memory(session_id)  # each worker its own memory, as apps do
                barrier.wait()
                for i in range(turns):
                    face.add_messages(tagged_turn(w, i))
            except BaseException as exc:
                errors.append(exc)

        def read() -> None:
            # While the writers run: no turn folded twice, none both folded and shown, and
            # the summary never goes back (a fold never overwrites a newer one).
            try:
                face = self.memory(session_id)
                barrier.wait()
                folded = 0
                while not done.is_set():
                    context = face.get_context()  # first: what it shows was stored before
                    if self.summarizes:
                        check_fates(face.get_history(), context, done=False)
                        now = len(summary_tags(context))
                        assert now >= folded, f"the summary went back from {folded} to {now}"
                        folded = now
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
        self.check_writers(self.memory(session_id), writers, turns)


class AsyncMemoryContract(_Contract):
    """The contract through the async API."""

    use_async = True

    def test_tasks_on_one_session_lose_nothing(self) -> None:
        writers, turns = 4, 15
        store = self.store()

        async def write(w: int) -> None:
            memory = make_memory(self.kind, store, "tasks")
            for i in range(turns):
                await memory.aadd_messages(tagged_turn(w, i))

        async def read(writing: asyncio.Future[Any]) -> None:
            # As the sync contract's reader thread: sound fates, a summary that never goes back.
            memory = make_memory(self.kind, store, "tasks")
            folded = 0
            while not writing.done():
                context = await memory.aget_context()
                if self.summarizes:
                    check_fates(await memory.aget_history(), context, done=False)
                    now = len(summary_tags(context))
                    assert now >= folded, f"the summary went back from {folded} to {now}"
                    folded = now
                await asyncio.sleep(0)  # let the writers on; not a synchronisation wait

        async def main() -> None:
            writing = asyncio.gather(*(write(w) for w in range(writers)))
            await read(writing)
            await writing

        self._loop.run_until_complete(main())
        self.check_writers(self.memory("tasks"), writers, turns)


def _stable(stats: dict[str, Any]) -> dict[str, Any]:
    """Stats without what belongs to one memory object rather than to the session."""
    mine = {"summary_prompt_tokens", "summary_completion_tokens", "summary_failures"}
    return {k: v for k, v in stats.items() if k not in mine | {"summary_error"}}

"""SQLiteStore and AsyncSQLiteStore: the store contract, and what only SQLite has to show."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import zerda.stores._sqlite as sqlite_module
from _conversations import conversation
from _processes import run_processes
from stores.contract import (
    AsyncStoreContract,
    FakeClock,
    StoreContract,
    assert_same_tail,
    assistant,
    system,
    user,
)
from zerda import ApproxCounter
from zerda.errors import (
    ConfigurationError,
    CorruptDataError,
    StoreUnavailableError,
    ZerdaError,
)
from zerda.memory import ConversationBufferWindowMemory, ConversationTokenBufferMemory
from zerda.messages import Message, Role
from zerda.stores import (
    AsyncSQLiteStore,
    AsyncStore,
    InMemoryStore,
    SQLiteStore,
    Store,
)
from zerda.stores._base import AsyncOverThread, WouldWait
from zerda.stores._sqlite import MIGRATIONS, TAIL_QUERY


class TestSQLiteStore(StoreContract):
    supports_processes = True

    def make_store(
        self, *, ttl: float | None, max_messages: int | None, clock: Callable[[], float]
    ) -> SQLiteStore:
        return SQLiteStore(self.fresh_path(".db"), ttl=ttl, max_messages=max_messages, clock=clock)

    def reopen_recipe(self, store: Any) -> tuple[str, dict[str, Any]]:
        return "zerda.stores:SQLiteStore", {"path": store.path}


class TestSQLiteStoreInMemoryDatabase(StoreContract):
    """``":memory:"``: a private database per store, same code paths otherwise."""

    def make_store(
        self, *, ttl: float | None, max_messages: int | None, clock: Callable[[], float]
    ) -> SQLiteStore:
        return SQLiteStore(":memory:", ttl=ttl, max_messages=max_messages, clock=clock)


class TestAsyncSQLiteStore(AsyncStoreContract):
    supports_processes = True

    def make_store(
        self, *, ttl: float | None, max_messages: int | None, clock: Callable[[], float]
    ) -> AsyncSQLiteStore:
        return AsyncSQLiteStore(
            self.fresh_path(".db"), ttl=ttl, max_messages=max_messages, clock=clock
        )

    def reopen_recipe(self, store: Any) -> tuple[str, dict[str, Any]]:
        return "zerda.stores:AsyncSQLiteStore", {"path": store.path}


# -- helpers -------------------------------------------------------------------------------------


def raw_connection(path: Path) -> sqlite3.Connection:
    """A plain sqlite3 connection, to look at or damage the file behind the store's back."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA busy_timeout = 5000")
    return db


def vm_steps(store: SQLiteStore, read: Callable[[], object]) -> int:
    """How many SQLite virtual machine steps ``read`` takes: a measure of work, not of time."""
    steps = [0]

    def tick() -> int:
        steps[0] += 1
        return 0

    db = store._db
    assert db is not None
    db.set_progress_handler(tick, 1)
    try:
        read()
    finally:
        db.set_progress_handler(None, 1)
    return steps[0]


# -- connection settings ------------------------------------------------------------------------


def test_wal_busy_timeout_and_synchronous_are_set(tmp_path: Path) -> None:
    path = tmp_path / "z.db"
    with SQLiteStore(path, timeout=2.5) as store:
        db = store._db
        assert db is not None
        assert db.execute("PRAGMA busy_timeout").fetchone() == (2500,)
        assert db.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL
        assert db.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)  # the store's own
    # WAL is a property of the file: another connection sees it.
    db = raw_connection(path)
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    db.close()


def test_a_held_write_lock_gives_store_unavailable_after_the_timeout(tmp_path: Path) -> None:
    path = tmp_path / "z.db"
    store = SQLiteStore(path, timeout=0.05)
    holder = raw_connection(path)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreUnavailableError, match="locked") as info:
            store.append("s", [Message(Role.USER, "hi")])
        assert str(path) in str(info.value)
        assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        # Readers are not blocked by a writer under WAL.
        assert store.history("s") == []
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    store.append("s", [Message(Role.USER, "hi")])  # the failed batch left nothing behind
    assert [m.content for m in store.history("s")] == ["hi"]
    store.close()


def test_options_are_checked(tmp_path: Path) -> None:
    for bad in ("", None, 3, b"z.db"):
        with pytest.raises(ConfigurationError, match="path"):
            SQLiteStore(bad)  # type: ignore[arg-type]
    for timeout in (-1, "5", True, float("nan")):
        with pytest.raises(ConfigurationError, match="timeout"):
            SQLiteStore(tmp_path / "z.db", timeout=timeout)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="ttl"):
        AsyncSQLiteStore(tmp_path / "z.db", ttl=0)


def test_parent_folders_are_created(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "z.db"
    with SQLiteStore(path) as store:
        store.append("s", [Message(Role.USER, "hi")])
        assert store.path == str(path)
    assert path.is_file()


# -- schema and migrations ----------------------------------------------------------------------


def applied(path: Path) -> list[tuple[str, float]]:
    db = raw_connection(path)
    rows = db.execute("SELECT name, applied_at FROM _zerda_migrations ORDER BY rowid").fetchall()
    db.close()
    return rows


def test_migrations_are_recorded_once(tmp_path: Path) -> None:
    path = tmp_path / "z.db"
    with SQLiteStore(path) as store:
        assert store.schema_version == len(MIGRATIONS) >= 1
        store.append("s", [Message(Role.USER, "kept")])
    first = applied(path)
    assert [name for name, _ in first] == [m.__name__ for m in MIGRATIONS]
    with SQLiteStore(path) as again:
        assert again.schema_version == len(MIGRATIONS)
        assert [m.content for m in again.history("s")] == ["kept"]
    assert applied(path) == first, "reopening ran the migrations again"


def test_a_new_migration_is_applied_once_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "z.db"
    SQLiteStore(path).close()
    calls: list[str] = []

    def m900_add_notes(db: sqlite3.Connection) -> None:
        calls.append("m900")
        db.execute("CREATE TABLE notes (text TEXT)")

    monkeypatch.setattr(sqlite_module, "MIGRATIONS", [*MIGRATIONS, m900_add_notes])
    for _ in range(2):
        with SQLiteStore(path) as store:
            assert store.schema_version == len(MIGRATIONS) + 1
    assert calls == ["m900"]
    assert [name for name, _ in applied(path)][-1] == "m900_add_notes"


def test_a_file_from_before_message_ids_migrates_and_keeps_its_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "z.db"
    monkeypatch.setattr(sqlite_module, "MIGRATIONS", MIGRATIONS[:1])
    SQLiteStore(path).close()
    assert [name for name, _ in applied(path)] == ["m001_sessions_and_messages"]
    monkeypatch.undo()
    # What the first schema's code wrote: two messages and metadata, without ids.
    old = [Message(Role.USER, "old q"), Message(Role.ASSISTANT, "old a")]
    db = raw_connection(path)
    db.execute(
        "INSERT INTO sessions (session_id, created_at, updated_at, metadata, next_seq, "
        "next_turn) VALUES ('s', 1, 1, '{\"k\":1}', 2, 1)"
    )
    for seq, m in enumerate(old):
        db.execute(
            "INSERT INTO messages VALUES (1, 0, ?, ?, ?, ?)",
            (seq, m.role.value, m.to_json(), f'{{"x":{seq + 1}}}'),
        )
    db.commit()
    db.close()
    new = [Message(Role.USER, "q", id="q1"), Message(Role.ASSISTANT, "a", id="a1")]
    with SQLiteStore(path) as store:
        assert store.schema_version == len(MIGRATIONS)
        assert store.history("s") == old
        assert store.append("s", new, {"x": [3, 4]}) == 2
        assert store.append("s", new, {"x": [3, 4]}) == 0
        assert store.history("s") == old + new
        tail = store.tail("s", None, "x")
        assert (list(tail.tokens), dict(tail.metadata)) == ([1, 2, 3, 4], {"k": 1})
    assert [name for name, _ in applied(path)] == [m.__name__ for m in MIGRATIONS]


def test_a_failing_migration_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "z.db"
    with SQLiteStore(path) as store:
        store.append("s", [Message(Role.USER, "kept")])
    before = applied(path)

    def m900_half_done(db: sqlite3.Connection) -> None:
        db.execute("CREATE TABLE half (x)")
        db.execute("this is not SQL")

    monkeypatch.setattr(sqlite_module, "MIGRATIONS", [*MIGRATIONS, m900_half_done])
    with pytest.raises(StoreUnavailableError, match="syntax error"):
        SQLiteStore(path)
    assert applied(path) == before
    db = raw_connection(path)
    assert db.execute("SELECT name FROM sqlite_master WHERE name = 'half'").fetchall() == []
    db.close()
    monkeypatch.undo()
    with SQLiteStore(path) as store:
        assert [m.content for m in store.history("s")] == ["kept"]


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "z.db"
    with SQLiteStore(path) as store:
        store.append("s", [Message(Role.USER, "kept")])
    db = raw_connection(path)
    db.execute("INSERT INTO _zerda_migrations VALUES ('m999_from_the_future', 0)")
    db.close()
    before = applied(path)
    with pytest.raises(ZerdaError, match="newer") as info:
        SQLiteStore(path)
    assert str(path) in str(info.value)
    assert "m999_from_the_future" in str(info.value)
    assert applied(path) == before


# -- tail reads cost what they return -----------------------------------------------------------


def test_tail_query_plan_is_a_primary_key_range(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "z.db") as store:
        store.append("s", conversation(50))
        db = store._db
        assert db is not None
        for query, args in ((TAIL_QUERY, (1, 40)), (sqlite_module._SYSTEM_ROWS, (1,))):
            plan = " | ".join(row[3] for row in db.execute(f"EXPLAIN QUERY PLAN {query}", args))
            assert "SEARCH messages USING PRIMARY KEY (sid=? AND turn" in plan, plan
            assert "SCAN" not in plan, plan
            assert "TEMP B-TREE" not in plan, plan  # read in key order, never sorted


def test_tail_work_does_not_grow_with_the_session_or_the_file(tmp_path: Path) -> None:
    small = SQLiteStore(tmp_path / "small.db")
    small.append("s", conversation(20))
    big = SQLiteStore(tmp_path / "big.db")
    for n in range(20):
        big.append(f"other{n:02d}", conversation(100, tag=f"o{n}"))
    big.append("s", conversation(3020))  # ends with turns shaped like the small one's
    big.append("zz-after", conversation(100))
    for turns in (0, 1, 5):
        shape = [m.role for m in small.tail("s", turns).messages]
        assert [m.role for m in big.tail("s", turns).messages] == shape
        small_steps = vm_steps(small, functools.partial(small.tail, "s", turns, "x"))
        big_steps = vm_steps(big, functools.partial(big.tail, "s", turns, "x"))
        # The handler is polled, not called on every step: allow the odd step of jitter.
        assert abs(big_steps - small_steps) <= 3, (turns, small_steps, big_steps)
    # The measure does see work that grows with the session.
    whole = vm_steps(big, lambda: big.tail("s", None))
    assert whole > 50 * vm_steps(small, lambda: small.tail("s", 5))
    small.close()
    big.close()


# -- editing the log (issue #16) -------------------------------------------------------------------


def test_edits_after_retention_trimmed_behave_like_the_in_memory_store(tmp_path: Path) -> None:
    """Retention keeps system messages ahead of the log it trimmed (``system_trimmed``); an
    edit puts them back into the log, as InMemoryStore's rebuild does, so that later trims
    agree. A session left with no turn numbers the next one as a new session would."""
    clock = FakeClock()
    reference = InMemoryStore(max_messages=3, clock=clock)
    store = SQLiteStore(tmp_path / "s.db", max_messages=3, clock=clock)
    log = [
        system("s0", id="s0"),
        user("q1", id="u1"),
        assistant("a1", id="a1"),
        system("s1", id="s1"),
        user("q2", id="u2"),
        assistant("a2", id="a2"),
        user("q3", id="u3"),
        assistant("a3", id="a3"),
    ]
    later = [
        user("q4", id="u4"),
        assistant("a4", id="a4"),
        user("q5", id="u5"),
        assistant("welcome", id="g"),
        user("q6", id="u6"),
        assistant("a6", id="a6"),
    ]
    steps: list[Callable[[Any], object]] = [
        lambda s: s.append("s", log, {"c": list(range(1, 9))}),  # trims s0 and s1 away
        lambda s: s.edit_message("s", "s0", "s0, edited"),
        lambda s: s.append("s", later[:1], {"c": [9]}),
        lambda s: s.delete_messages("s", ["u3", "s1"]),  # one of them trimmed
        lambda s: s.append("s", later[1:3]),
        lambda s: s.delete_messages("s", ["a3", "u4", "a4", "u5"]),  # every turn
        lambda s: s.append("s", later[3:4]),  # a turn of its own
        lambda s: s.fork("s", "f"),
        lambda s: s.pop_turn("s"),
        lambda s: s.append("f", later[4:]),
    ]
    for n, step in enumerate(steps):
        clock.advance(1)
        assert step(store) == step(reference), n
        for sid in ("s", "f"):
            assert store.history(sid) == reference.history(sid), (n, sid)
            for turns in (None, 1):
                assert_same_tail(store.tail(sid, turns, "c"), reference.tail(sid, turns, "c"))
        assert store.list_sessions() == reference.list_sessions(), n
    store.close()


def test_an_edit_near_the_end_of_a_long_session_does_work_for_what_follows(
    tmp_path: Path,
) -> None:
    """Deleting, popping and editing at the end of a session rewrite the rows from the edit
    on, not the session: the same SQLite work for 60 messages as for 6,000."""

    def steps(turns: int) -> list[int]:
        store = SQLiteStore(tmp_path / f"{turns}.db")
        log = [dataclasses.replace(m, id=f"m{i}") for i, m in enumerate(conversation(turns))]
        store.append("s", log)
        edits: list[Callable[[], object]] = [
            lambda: store.delete_messages("s", [log[-3].id or ""]),
            lambda: store.pop_turn("s"),
            lambda: store.edit_message("s", log[-6].id or "", "changed"),
        ]
        out = [vm_steps(store, edit) for edit in edits]
        store.close()
        return out

    small, big = steps(20), steps(2000)
    for a, b in zip(small, big, strict=True):
        assert b <= a + 20, (small, big)


# -- persistence: a restart, a second worker -----------------------------------------------------


def test_memories_rebuilt_over_the_same_file_give_the_same_context(tmp_path: Path) -> None:
    path = tmp_path / "chat.db"
    counter = ApproxCounter()
    store = SQLiteStore(path)
    window = ConversationBufferWindowMemory(k=3, store=store, session_id="chat")
    tokens = ConversationTokenBufferMemory(
        120, token_counter=counter, store=store, session_id="chat-tokens"
    )
    for memory in (window, tokens):
        for m in conversation(12):
            memory.add_message(m)
    before = (window.get_context(), tokens.get_context(), tokens.get_memory_stats())
    assert len(before[0]) < len(conversation(12))
    store.close()

    store = SQLiteStore(path)
    window = ConversationBufferWindowMemory(k=3, store=store, session_id="chat")
    tokens = ConversationTokenBufferMemory(
        120, token_counter=counter, store=store, session_id="chat-tokens"
    )
    assert (window.get_context(), tokens.get_context(), tokens.get_memory_stats()) == before
    # The counts were stored with the messages: nothing needs counting again.
    tail = store.tail("chat-tokens", None, counter.name)
    assert None not in tail.tokens
    assert None not in tail.system_tokens
    assert [m.content for m in window.get_history()] == [m.content for m in conversation(12)]
    store.close()


def test_two_workers_over_one_file_see_each_others_turns(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    with SQLiteStore(path) as one, SQLiteStore(path) as two:
        first = ConversationBufferWindowMemory(k=2, store=one, session_id="c")
        second = ConversationBufferWindowMemory(k=2, store=two, session_id="c")
        first.save_context({"input": "one"}, {"output": "1"})
        second.save_context({"input": "two"}, {"output": "2"})
        first.save_context({"input": "three"}, {"output": "3"})
        for memory in (first, second):
            assert [t["input"] for t in memory.get_messages()] == ["two", "three"]
        second.clear()
        assert first.get_messages() == []


def open_and_append(path: str, writer: int, barrier: Any) -> None:
    """A spawned process: open the (maybe not yet created) file with the others, and write."""
    barrier.wait(60)
    with SQLiteStore(path) as store:
        for b in range(50):
            store.append("s", [Message(Role.USER, f"{writer}:{b}")])


def test_processes_creating_one_file_at_once_all_get_in(tmp_path: Path) -> None:
    path = tmp_path / "new" / "z.db"
    run_processes(open_and_append, [(str(path), w) for w in range(6)], timeout=120)
    with SQLiteStore(path) as store:
        assert store.schema_version == len(MIGRATIONS)
        contents = [m.content or "" for m in store.history("s")]
    assert sorted(contents) == sorted(f"{w}:{b}" for w in range(6) for b in range(50))
    for w in range(6):
        assert [c for c in contents if c.startswith(f"{w}:")] == [f"{w}:{b}" for b in range(50)]
    assert [name for name, _ in applied(path)] == [m.__name__ for m in MIGRATIONS]


# -- a failed batch leaves nothing -------------------------------------------------------------


def test_a_batch_that_fails_inside_the_transaction_is_rolled_back(tmp_path: Path) -> None:
    path = tmp_path / "z.db"
    store = SQLiteStore(path)
    store.append("s", [Message(Role.USER, "before")], {"x": [1]})
    db = raw_connection(path)
    db.execute(
        "CREATE TRIGGER boom BEFORE INSERT ON messages WHEN NEW.body LIKE '%boom%' "
        "BEGIN SELECT RAISE(ABORT, 'boom refused'); END"
    )
    batch = [Message(Role.USER, "fine"), Message(Role.ASSISTANT, "ok"), Message(Role.USER, "boom")]
    with pytest.raises(ZerdaError, match="boom refused"):
        store.append("s", batch, {"x": [2, 3, 4]})
    tail = store.tail("s", None, "x")
    assert [m.content for m in tail.messages] == ["before"]
    assert (tail.total_turns, tail.total_messages, list(tail.tokens)) == (1, 1, [1])
    db.execute("DROP TRIGGER boom")
    db.close()
    store.append("s", batch, {"x": [2, 3, 4]})
    assert [m.content for m in store.history("s")] == ["before", "fine", "ok", "boom"]
    assert list(store.tail("s", None, "x").tokens) == [1, 2, 3, 4]
    store.close()


def test_token_counts_that_are_not_json_are_refused_before_writing(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "z.db") as store:
        with pytest.raises(ConfigurationError, match="token count"):
            store.append("s", [Message(Role.USER, "hi")], {"x": [object()]})  # type: ignore[list-item]
        assert store.list_sessions() == []


# -- crash safety --------------------------------------------------------------------------------

CRASH_WRITER = """
import sys
from zerda import Message
from zerda.stores import SQLiteStore

path, kill_at, block_on = sys.argv[1], int(sys.argv[2]), sys.argv[3]
store = SQLiteStore(path)
b = 0


def trace(sql):
    # Batch ``kill_at`` announces the statement ``block_on`` of its transaction, then waits
    # there (for a line that never comes): the test kills this process in mid-write.
    if b == kill_at and sql.startswith(block_on):
        print("writing", b, flush=True)
        sys.stdin.readline()


store._db.set_trace_callback(trace)
padding = "x" * 3000
while True:
    # The batch killed is big enough (3 MB) to spill uncommitted pages into the WAL.
    size = 1000 if b == kill_at else 1 + b % 17
    batch = [
        Message("user" if i == 0 else "assistant", f"{b}:{i}/{size} {padding}")
        for i in range(size)
    ]
    store.append("crash", batch, {"n": [b] * size})
    print("stored", b, flush=True)  # acknowledged: append returned
    b += 1
"""


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
@pytest.mark.parametrize(
    "block_on",
    [
        "INSERT INTO messages",  # its first row going in
        "UPDATE sessions",  # every row in, the session's counters next
        "COMMIT",  # everything written but the commit
        "-",  # no stop: killed wherever it happens to be
    ],
)
def test_sigkill_while_writing_keeps_every_acknowledged_batch_whole(
    tmp_path: Path, block_on: str
) -> None:
    path = tmp_path / "crash.db"
    kill_at = 150
    SQLiteStore(path).close()  # created beforehand, so the writer starts writing at once
    errors = tmp_path / "stderr.txt"
    with errors.open("w") as stderr:
        child = subprocess.Popen(
            [sys.executable, "-c", CRASH_WRITER, str(path), str(kill_at), block_on],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    assert child.stdout is not None
    acknowledged = -1
    try:
        while True:
            line = child.stdout.readline()
            assert line, f"the writer stopped: {errors.read_text()}"
            what, number = line.split()
            if what == "stored":
                acknowledged = int(number)
            if int(number) >= kill_at:
                child.send_signal(signal.SIGKILL)
                break
        for line in child.stdout.read().splitlines():  # printed before the kill landed
            what, number = line.split()
            if what == "stored":
                acknowledged = int(number)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=60)
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                pipe.close()
    assert child.returncode == -signal.SIGKILL
    assert acknowledged >= kill_at - 1

    with SQLiteStore(path) as store:
        history = store.history("crash")
        tail = store.tail("crash", None, "n")
        db = store._db
        assert db is not None
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    b = i = 0
    while i < len(history):
        size = 1000 if b == kill_at else 1 + b % 17
        for j in range(size):
            assert i + j < len(history), f"batch {b} was stored in part"
            assert (history[i + j].content or "").startswith(f"{b}:{j}/{size} "), (b, j)
            assert tail.tokens[i + j] == b
        i += size
        b += 1
    assert tail.total_turns == b
    if block_on == "-":
        # Every acknowledged batch is there; at most one more (committed, not yet printed).
        assert acknowledged + 1 <= b <= acknowledged + 2
    else:
        # Killed inside the transaction of batch ``kill_at``: it is not there, all before are.
        assert acknowledged == kill_at - 1
        assert b == kill_at


# -- bad files and bad rows ----------------------------------------------------------------------


def test_a_file_that_is_not_a_database_is_corrupt_data_and_left_untouched(
    tmp_path: Path,
) -> None:
    path = tmp_path / "notes.db"
    content = b"these are my notes, not a database\n" * 200
    path.write_bytes(content)
    with pytest.raises(CorruptDataError, match="not a database") as info:
        SQLiteStore(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value.__cause__, sqlite3.DatabaseError)
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]


def test_a_damaged_database_is_corrupt_data(tmp_path: Path) -> None:
    path = tmp_path / "z.db"
    with SQLiteStore(path) as store:
        store.append("s", conversation(400))
    db = raw_connection(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page_size = db.execute("PRAGMA page_size").fetchone()[0]
    db.close()
    with path.open("r+b") as f:  # scribble over every page but the first (the schema)
        f.seek(page_size)
        f.write(b"\xa5" * (path.stat().st_size - page_size))
    with pytest.raises(CorruptDataError, match="malformed") as info, SQLiteStore(path) as store:
        store.history("s")
    assert str(path) in str(info.value)


def test_an_unopenable_path_is_store_unavailable(tmp_path: Path) -> None:
    folder = tmp_path / "a-folder"
    folder.mkdir()
    with pytest.raises(StoreUnavailableError) as info:
        SQLiteStore(folder)
    assert str(folder) in str(info.value)
    assert isinstance(info.value.__cause__, sqlite3.OperationalError)

    a_file = tmp_path / "a-file"
    a_file.write_text("")
    with pytest.raises(StoreUnavailableError) as info:
        SQLiteStore(a_file / "z.db")
    assert str(a_file / "z.db") in str(info.value)


@pytest.mark.parametrize(
    ("column", "value", "match"),
    [
        ("body", "{not json", "message"),
        ("body", '{"role": "wizard", "content": "x"}', "message"),
        ("tokens", "[1, 2]", "token counts"),
    ],
)
def test_a_row_that_cannot_be_decoded_is_corrupt_data(
    tmp_path: Path, column: str, value: str, match: str
) -> None:
    path = tmp_path / "z.db"
    store = SQLiteStore(path)
    store.append("good", [Message(Role.USER, "fine")], {"x": [1]})
    store.append("bad-one", [Message(Role.USER, "fine")], {"x": [1]})
    db = raw_connection(path)
    db.execute(
        f"UPDATE messages SET {column} = ? "
        "WHERE sid = (SELECT sid FROM sessions WHERE session_id = 'bad-one')",
        (value,),
    )
    db.close()
    fresh = SQLiteStore(path)  # nothing decoded before
    with pytest.raises(CorruptDataError, match=match) as info:
        fresh.tail("bad-one", None, "x")
    assert str(path) in str(info.value)
    assert "'bad-one'" in str(info.value)
    if column == "body":
        with pytest.raises(CorruptDataError, match="'bad-one'"):
            fresh.history("bad-one")
    assert [m.content for m in fresh.history("good")] == ["fine"]
    store.close()
    fresh.close()


def test_metadata_that_cannot_be_decoded_is_corrupt_data(tmp_path: Path) -> None:
    path = tmp_path / "z.db"
    store = SQLiteStore(path)
    store.update_metadata("s", {"a": 1})
    db = raw_connection(path)
    db.execute("UPDATE sessions SET metadata = '[oops'")
    db.close()
    with pytest.raises(CorruptDataError, match="metadata of session 's'"):
        store.get_metadata("s")
    with pytest.raises(CorruptDataError):
        store.update_metadata("s", {"b": 2})
    store.close()


# -- closing -------------------------------------------------------------------------------------


def test_a_closed_store_says_so(tmp_path: Path) -> None:
    path = tmp_path / "z.db"
    with SQLiteStore(path) as store:
        store.append("s", [Message(Role.USER, "hi")])
    for call in (
        lambda: store.append("s", [Message(Role.USER, "again")]),
        lambda: store.tail("s", 1),
        lambda: store.list_sessions(),
    ):
        with pytest.raises(StoreUnavailableError, match="closed"):
            call()
    store.close()  # closing twice is fine
    with SQLiteStore(path) as again:
        assert [m.content for m in again.history("s")] == ["hi"]


# -- the async store -----------------------------------------------------------------------------


def test_async_store_runs_sqlite_off_the_event_loop_thread(tmp_path: Path) -> None:
    threads: set[int] = set()

    def clock() -> float:  # called by the store while it reads and writes
        threads.add(threading.get_ident())
        return time.time()

    async def main() -> int:
        async with AsyncSQLiteStore(tmp_path / "z.db", ttl=60, clock=clock) as store:
            await store.aappend("s", conversation(3))
            assert [m.content for m in await store.ahistory("s")] == [
                m.content for m in conversation(3)
            ]
            tail = await store.atail("s", 1)
            assert tail.total_turns == 3
            assert await store.aschema_version() == len(MIGRATIONS)
            assert [info.session_id for info in await store.alist_sessions()] == ["s"]
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert threads, "the clock was never called"
    assert loop_thread not in threads
    assert len(threads) == 1, "one worker thread owns the connection"


def test_async_store_is_only_an_async_store(tmp_path: Path) -> None:
    store = AsyncSQLiteStore(tmp_path / "z.db")
    assert isinstance(store, AsyncStore)
    assert not isinstance(store, Store)
    assert not hasattr(store, "append")
    asyncio.run(store.aclose())


def test_memory_over_async_store_is_native_async_and_refuses_sync_calls(tmp_path: Path) -> None:
    path = tmp_path / "z.db"

    async def main() -> list[Message]:
        store = AsyncSQLiteStore(path)
        memory = ConversationTokenBufferMemory(
            80, token_counter=ApproxCounter(), store=store, session_id="c"
        )
        for m in conversation(6):
            await memory.aadd_message(m)
        context = await memory.aget_context()
        with pytest.raises(ZerdaError, match="async"):
            memory.get_context()
        with pytest.raises(ZerdaError, match="async"):
            memory.add_message(Message(Role.USER, "sync"))
        await store.aclose()
        return context

    context = asyncio.run(main())
    with SQLiteStore(path) as sync:
        same = ConversationTokenBufferMemory(
            80, token_counter=ApproxCounter(), store=sync, session_id="c"
        )
        assert same.get_context() == context
        assert len(context) < len(conversation(6))


def test_async_store_errors_come_from_the_first_await(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"not a database at all" * 100)

    async def main() -> None:
        store = AsyncSQLiteStore(path)  # opening waits for the worker thread
        with pytest.raises(CorruptDataError, match="not a database"):
            await store.atail("s", 1)
        await store.aclose()
        await store.aclose()  # closing twice is fine
        with pytest.raises(StoreUnavailableError, match="closed"):
            await store.atail("s", 1)

    asyncio.run(main())


def test_async_store_lets_other_tasks_run_while_it_waits_for_the_file(tmp_path: Path) -> None:
    """An append waiting on a lock held elsewhere does not stop the event loop."""
    path = tmp_path / "z.db"
    SQLiteStore(path).close()
    holder = raw_connection(path)

    async def main() -> list[str]:
        events: list[str] = []
        # Were the append to block the loop, it would fail after this timeout instead.
        store = AsyncSQLiteStore(path, timeout=5)
        holder.execute("BEGIN IMMEDIATE")
        append = asyncio.ensure_future(store.aappend("s", [Message(Role.USER, "waited")]))
        await asyncio.sleep(0)  # let the append start; it now waits for the lock
        events.append("loop ran while the append waited")
        assert not append.done()
        holder.execute("COMMIT")
        await append
        events.append("append done")
        await store.aclose()
        return events

    try:
        assert asyncio.run(main()) == ["loop ran while the append waited", "append done"]
    finally:
        holder.close()
    with SQLiteStore(path) as store:
        assert [m.content for m in store.history("s")] == ["waited"]


# -- async calls over a sync SQLiteStore (AsyncOverThread: memories, zerda serve) -------------


def _threads_of(store: SQLiteStore) -> set[int]:
    """The threads that run ``store``'s transactions from now on (recorded by its clock,
    which every append and metadata write reads inside the transaction)."""
    seen: set[int] = set()

    def clock() -> float:
        seen.add(threading.get_ident())
        return time.time()

    store._clock = clock
    return seen


def test_short_async_calls_run_at_once_on_the_loop_when_the_store_is_free(
    tmp_path: Path,
) -> None:
    """A hop to a worker thread costs more than a short transaction: appends, bounded
    tails and metadata run on the event loop's thread when nothing holds a lock."""
    store = SQLiteStore(tmp_path / "z.db")
    threads = _threads_of(store)
    wrapped = AsyncOverThread(store)

    async def main() -> int:
        await wrapped.aappend("s", conversation(2))
        await wrapped.aupdate_metadata("s", {"k": 1})
        assert await wrapped.acompare_and_set("s", "k", 1, 2)
        assert (await wrapped.aget_metadata("s"))["k"] == 2
        assert (await wrapped.atail("s", 1)).total_turns == 2
        return threading.get_ident()

    assert threads == {asyncio.run(main())}
    assert store._db is not None
    assert store._db.execute("PRAGMA busy_timeout").fetchone() == (30000,)  # put back
    store.close()


def test_a_whole_log_is_read_in_a_thread(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "z.db")
    store.append("s", conversation(2))
    wrapped = AsyncOverThread(store)
    readers: set[int] = set()
    decode = store._decode

    def recording(*args: Any, **kwargs: Any) -> Message:
        readers.add(threading.get_ident())
        return decode(*args, **kwargs)

    store._decode = recording  # type: ignore[method-assign]
    store._decoded = sqlite_module.DecodedMessages(16)  # nothing decoded yet

    async def main() -> int:
        assert (await wrapped.atail("s", None)).total_turns == 2
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert readers, "nothing was decoded"
    assert loop_thread not in readers
    # So is an append that asks the whole log back.
    readers.clear()
    store._decoded = sqlite_module.DecodedMessages(16)

    async def append_then_all() -> int:
        _, tail = await wrapped.aappend_then_tail("s", [Message(Role.USER, "more")], None, None)
        assert tail.total_turns == 3
        return threading.get_ident()

    loop_thread = asyncio.run(append_then_all())
    assert readers, "nothing was decoded"
    assert loop_thread not in readers
    store.close()


def test_an_async_append_over_a_busy_file_waits_in_a_thread_and_stores_once(
    tmp_path: Path,
) -> None:
    """Another connection holds the write lock: the append does not wait on the loop (which
    runs on), gives up nothing, and is stored once when the lock is released."""
    path = tmp_path / "z.db"
    store = SQLiteStore(path, timeout=5)
    threads = _threads_of(store)
    wrapped = AsyncOverThread(store)
    holder = raw_connection(path)

    async def main() -> int:
        holder.execute("BEGIN IMMEDIATE")
        append = asyncio.ensure_future(wrapped.aappend("s", [Message(Role.USER, "waited")]))
        await asyncio.sleep(0.05)  # were the append waiting on the loop, this would not run
        assert not append.done()
        holder.execute("COMMIT")
        assert await append == 1
        return threading.get_ident()

    try:
        loop_thread = asyncio.run(main())
    finally:
        holder.close()
    assert threads, "the append never ran"
    assert loop_thread not in threads  # the write that waited ran in a thread
    assert [m.content for m in store.history("s")] == ["waited"]
    assert store._db is not None
    assert store._db.execute("PRAGMA busy_timeout").fetchone() == (5000,)
    store.close()


def test_an_async_call_while_a_thread_holds_the_store_goes_to_a_thread(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "z.db")
    wrapped = AsyncOverThread(store)

    async def main() -> list[str]:
        events: list[str] = []
        store._lock.acquire()  # as a worker thread in the middle of a transaction would
        try:
            append = asyncio.ensure_future(wrapped.aappend("s", [Message(Role.USER, "later")]))
            await asyncio.sleep(0.05)
            events.append("loop ran while the store was held")
            assert not append.done()
        finally:
            store._lock.release()
        await append
        events.append("append done")
        return events

    assert asyncio.run(main()) == ["loop ran while the store was held", "append done"]
    assert [m.content for m in store.history("s")] == ["later"]
    store.close()


def test_run_now_refuses_a_write_that_would_wait_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "z.db"
    store = SQLiteStore(path)
    holder = raw_connection(path)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(WouldWait):
            store.run_now(lambda s: s.append("s", [Message(Role.USER, "no")]))
        # A read does not wait for a writer under WAL: it runs.
        assert store.run_now(lambda s: s.history("s")) == []
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert store.history("s") == []
    assert store.run_now(lambda s: s.append("s", [Message(Role.USER, "yes")])) == 1
    assert [m.content for m in store.history("s")] == ["yes"]
    store.close()


def test_the_store_checkpoints_the_wal_in_a_thread_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite's automatic checkpoint (an fsync) would run inside the commit that crosses its
    threshold, on the caller's thread: the event loop itself for a short call from async
    code. The store checkpoints every few writes in a thread instead, and the WAL stays as
    small as a few writes."""
    monkeypatch.setattr(sqlite_module, "_CHECKPOINT_EVERY", 5)
    path = tmp_path / "z.db"
    store = SQLiteStore(path)
    checkpointed: list[int] = []
    checkpoint = store._checkpoint

    def recording() -> None:
        checkpoint()
        checkpointed.append(threading.get_ident())

    store._checkpoint = recording  # type: ignore[method-assign]
    text = "x" * 8000  # two pages a message
    for n in range(200):
        store.append("s", [Message(Role.USER, f"{n} {text}")])
        deadline = time.monotonic() + 10
        while store._checkpointing and time.monotonic() < deadline:  # let each one finish
            time.sleep(0.001)
    assert len(checkpointed) == 200 // 5
    assert threading.get_ident() not in checkpointed
    wal = Path(f"{path}-wal").stat().st_size
    assert wal < 20 * 2 * 4096 * 5, f"the WAL holds {wal} bytes after 200 writes"  # 400 without
    assert [m.content[:2] for m in store.history("s")[:2]] == ["0 ", "1 "]
    store.close()

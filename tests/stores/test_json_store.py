"""JSONFileStore: the store contract, and what a file adds (format, atomic writes, corruption,
crashes, several stores and processes over one file)."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zerda.stores._json as json_store
from stores.contract import (
    RICH_BATCHES,
    AsyncStoreContract,
    FakeClock,
    StoreContract,
    check_batches,
    tagged_batch,
    tagged_tokens,
)
from zerda.errors import (
    ConfigurationError,
    CorruptDataError,
    InvalidMessageError,
    MessageNotFoundError,
    SessionExistsError,
    StoreUnavailableError,
)
from zerda.memory import ConversationBufferWindowMemory, ConversationTokenBufferMemory
from zerda.messages import Message, Role, ToolCall
from zerda.parts import ImagePart, TextPart
from zerda.stores import AsyncStore, InMemoryStore, JSONFileStore, Store, Tail
from zerda.tokens import CallableCounter

posix_only = pytest.mark.skipif(os.name != "posix", reason="needs POSIX signals and fcntl")


# -- the contract ------------------------------------------------------------------------------


class _JSONFileContract:
    supports_processes = True

    def make_store(
        self, *, ttl: float | None, max_messages: int | None, clock: Callable[[], float]
    ) -> JSONFileStore:
        return JSONFileStore(
            self.fresh_path(".json"), ttl=ttl, max_messages=max_messages, clock=clock
        )

    def reopen_recipe(self, store: JSONFileStore) -> tuple[str, dict[str, Any]]:
        options = {"ttl": store.ttl, "max_messages": store.max_messages}
        return "zerda.stores:JSONFileStore", {"path": store.path, **options}

    # Every write rewrites the whole file and every writer reads it whole again after another
    # one wrote, so 4 x 500 takes tens of seconds; two writers still contend on every batch.
    process_writers = 2
    process_batches = 50


class TestJSONFileStore(_JSONFileContract, StoreContract):
    pass


class TestJSONFileStoreAsync(_JSONFileContract, AsyncStoreContract):
    pass


# -- helpers -------------------------------------------------------------------------------------


def rich_messages() -> list[Message]:
    """Every field a message has: tool calls, names, metadata, times, non-ASCII text."""
    return [
        Message(Role.SYSTEM, "Sé bref.", created_at=1.5),
        Message(Role.USER, "Weather in Zürich?", name="ada", metadata={"lang": "de", "n": [1]}),
        Message(
            Role.ASSISTANT,
            None,
            tool_calls=(
                ToolCall("call_1", "weather", '{"city": "Zürich"}'),
                ToolCall("call_2", "clock", "not json {"),
            ),
            created_at=1_700_000_000.125,
        ),
        Message(Role.TOOL, "12°C", tool_call_id="call_1"),
        Message(Role.TOOL, "09:00", tool_call_id="call_2", metadata={"ms": 3.25}),
        Message(Role.ASSISTANT, "12°C at 09:00 — 🌦", created_at=1_700_000_001.5),
    ]


def temp_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def reads(store: Store, session_id: str = "s") -> dict[str, Any]:
    """Everything a store shows about a session, and its session list."""
    tails = {
        (turns, counter): store.tail(session_id, turns, counter)
        for turns in (None, 0, 1, 2, 50)
        for counter in (None, "x", "y", "missing")
    }
    return {
        "tails": tails,
        "history": store.history(session_id),
        "metadata": store.get_metadata(session_id),
        "sessions": store.list_sessions(),
    }


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "chats.json"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


# -- the file ----------------------------------------------------------------------------------


def test_the_file_is_one_versioned_json_document(path: Path, clock: FakeClock) -> None:
    store = JSONFileStore(path, clock=clock)
    batch = rich_messages()
    store.append("s", batch, {"x": [1, 2, 3, 4, 5, 6]})
    clock.advance(2)
    store.update_metadata("s", {"summary": "weather"})
    store.append("t", [Message(Role.USER, "hi")])
    document = json.loads(path.read_bytes())
    assert document["format"] == "zerda-json"
    assert document["version"] == 1
    assert sorted(document["sessions"]) == ["s", "t"]
    s = document["sessions"]["s"]
    assert s["messages"] == [m.to_dict() for m in batch]
    assert s["tokens"] == {"x": [1, 2, 3, 4, 5, 6]}
    assert s["metadata"] == {"summary": "weather"}
    assert (s["created_at"], s["updated_at"]) == (clock.now - 2, clock.now)
    # Readable: UTF-8 text rather than escapes, one message per line.
    text = path.read_text(encoding="utf-8")
    assert "Zürich" in text
    assert sum(line.startswith('{"role":') for line in text.splitlines()) == 7


def test_everything_round_trips_through_a_reopen(path: Path, clock: FakeClock) -> None:
    reference = InMemoryStore(max_messages=4, clock=clock)
    store = JSONFileStore(path, max_messages=4, clock=clock)
    for s in (reference, store):
        for batch, tokens in RICH_BATCHES:
            s.append("s", batch, tokens)
        s.append("s", rich_messages(), {"y": [9, 8, 7, 6, 5, 4]})
        s.update_metadata("s", {"summary": "so far", "watermark": 12, "nested": {"a": [1, None]}})
        s.append("other", [Message(Role.USER, "hi")])
    clock.advance(1)
    expected = reads(reference)
    # Retention dropped turns with system messages in them: they stay, pinned, first.
    history = JSONFileStore(path).history("s")
    assert history[0].role is Role.SYSTEM
    assert history[1].role is Role.SYSTEM
    assert reads(store) == expected
    again = JSONFileStore(path, max_messages=4, clock=clock)
    assert reads(again) == expected
    assert reads(again, "other") == reads(reference, "other")
    # And the reopened store goes on exactly like the reference.
    for s in (reference, again):
        s.append("s", [Message(Role.USER, "more"), Message(Role.ASSISTANT, "yes")], {"x": [1, 2]})
    assert reads(again) == reads(reference)


def test_a_file_holding_a_lone_surrogate_is_refused_as_it_is(path: Path) -> None:
    """Zerda refuses text with no UTF-8 form; a file that holds some (escaped, as an older
    version wrote it) reads as corrupt and is left untouched."""
    with pytest.raises(InvalidMessageError, match="lone surrogate"):
        Message(Role.USER, "half a pair: \ud83d, and é")
    store = JSONFileStore(path)
    store.append("s", [Message(Role.USER, "fine")])
    data = path.read_bytes().replace(b'"fine"', b'"half a pair: \\ud83d"')
    path.write_bytes(data)
    with pytest.raises(CorruptDataError, match="lone surrogate"):
        JSONFileStore(path).history("s")
    assert path.read_bytes() == data


def test_a_missing_file_is_an_empty_store_and_reads_create_nothing(tmp_path: Path) -> None:
    path = tmp_path / "not" / "yet" / "chats.json"
    store = JSONFileStore(path)
    assert store.history("s") == []
    assert store.tail("s", None, "x") == Tail((), (), (), 0, 0)
    assert store.get_metadata("s") == {}
    assert store.list_sessions() == []
    assert store.delete_session("s") is False
    assert store.purge_expired() == 0
    store.clear()
    assert not (tmp_path / "not").exists()
    store.append("s", [Message(Role.USER, "hi")])
    assert JSONFileStore(path).history("s") == [Message(Role.USER, "hi")]


def test_clear_writes_an_empty_store(path: Path) -> None:
    store = JSONFileStore(path)
    store.append("s", [Message(Role.USER, "hi")])
    store.clear()
    assert json.loads(path.read_bytes())["sessions"] == {}
    assert JSONFileStore(path).list_sessions() == []


def test_bad_paths_and_counts_are_refused(path: Path) -> None:
    for bad in ("", 42, None):
        with pytest.raises(ConfigurationError, match="path"):
            JSONFileStore(bad)  # type: ignore[arg-type]
    store = JSONFileStore(path)
    for tokens in ({"x": [1.5]}, {"x": [True]}, {"x": [None]}, {1: [1]}):
        with pytest.raises(ConfigurationError):
            store.append("s", [Message(Role.USER, "hi")], tokens)  # type: ignore[dict-item]
    assert not path.exists()


def test_the_file_keeps_its_permissions(path: Path) -> None:
    store = JSONFileStore(path)
    store.append("s", [Message(Role.USER, "hi")])
    path.chmod(0o640)
    store.append("s", [Message(Role.USER, "again")])
    assert path.stat().st_mode & 0o777 == 0o640


def test_a_folder_in_the_way_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "chats.json").mkdir()
    store = JSONFileStore(tmp_path / "chats.json")
    with pytest.raises(StoreUnavailableError, match=r"chats\.json"):
        store.history("s")
    with pytest.raises(StoreUnavailableError, match=r"chats\.json"):
        store.append("s", [Message(Role.USER, "hi")])


def test_close_and_context_manager(path: Path) -> None:
    with JSONFileStore(path) as store:
        store.append("s", [Message(Role.USER, "hi")])
    for call in (lambda: store.history("s"), lambda: store.append("s", [])):
        with pytest.raises(StoreUnavailableError, match="closed"):
            call()
    store.close()  # idempotent
    assert JSONFileStore(path).history("s") == [Message(Role.USER, "hi")]


def test_it_is_a_sync_and_an_async_store(path: Path) -> None:
    store = JSONFileStore(path)
    assert isinstance(store, Store)
    assert isinstance(store, AsyncStore)

    async def main() -> list[Message]:
        await store.aappend("s", [Message(Role.USER, "hi")])
        await store.aupdate_metadata("s", {"k": 1})
        return await store.ahistory("s")

    assert asyncio.run(main()) == [Message(Role.USER, "hi")]
    assert JSONFileStore(path).get_metadata("s") == {"k": 1}


def test_edits_are_written_to_the_file_and_an_empty_store_creates_nothing(
    tmp_path: Path, clock: FakeClock
) -> None:
    path = tmp_path / "not" / "chats.json"
    store = JSONFileStore(path, ttl=100, max_messages=8, clock=clock)
    assert store.delete_messages("s", ["x"]) == 0
    assert store.pop_turn("s") == []
    assert store.fork("s", "t") == 0
    for edit in (lambda: store.edit_message("s", "x", "y"), lambda: store.fork("s", "t", "x")):
        with pytest.raises(MessageNotFoundError):
            edit()
    assert not (tmp_path / "not").exists()
    reference = InMemoryStore(ttl=100, max_messages=8, clock=clock)
    ids = (f"m{n}" for n in range(100))
    for batch, tokens in RICH_BATCHES:  # retention drops the greeting, m1
        clock.advance(1)
        ided = [dataclasses.replace(m, id=next(ids)) for m in batch]
        for s in (store, reference):
            s.append("s", ided, tokens)
    parts = (TextPart("see"), ImagePart("https://example.com/a.png"))
    for edit, outcome in [
        (lambda s: s.delete_messages("s", ["m5", "m4", "nope"]), 2),
        (lambda s: s.edit_message("s", "m7", parts).content, parts),
        (lambda s: s.fork("s", "t", "m9"), 7),
        (lambda s: [m.id for m in s.pop_turn("s")], ["m11", "m12"]),
        (lambda s: s.edit_message("t", "m3", None).content, None),
        (lambda s: s.delete_messages("t", ["m2"]), 1),
    ]:
        clock.advance(1)
        assert edit(store) == edit(reference) == outcome
        reopened = JSONFileStore(path, ttl=100, max_messages=8, clock=clock)
        for session_id in ("s", "t"):
            assert reads(reopened, session_id) == reads(reference, session_id)
            assert reads(store, session_id) == reads(reference, session_id)
    # An edit that changes nothing leaves the file as it is.
    before = path.stat()
    assert store.delete_messages("s", ["nope"]) == 0
    with pytest.raises(SessionExistsError):
        store.fork("s", "t")
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


# -- behaving exactly like InMemoryStore, whatever happens and whenever the file is reopened ------

_MESSAGES = [
    Message(Role.USER, "hi"),
    Message(Role.USER, ""),
    Message(Role.ASSISTANT, "ok", name="bot"),
    Message(Role.ASSISTANT, None, tool_calls=(ToolCall("c1", "f", "{}"),)),
    Message(Role.TOOL, "r", tool_call_id="c1", metadata={"k": [1, 2]}),
    Message(Role.SYSTEM, "sys"),
    Message(Role.SYSTEM, "note", created_at=5.0),
]
_SESSIONS = ["a", "b"]
_batches = st.lists(st.sampled_from(_MESSAGES), max_size=5)
_operations = st.one_of(
    st.tuples(
        st.just("append"),
        st.sampled_from(_SESSIONS),
        _batches,
        st.sets(st.sampled_from(["x", "y"])),
        st.integers(0, 100),
    ),
    st.tuples(
        st.just("metadata"),
        st.sampled_from(_SESSIONS),
        st.dictionaries(st.sampled_from(["k", "v"]), st.none() | st.integers(0, 3)),
    ),
    st.tuples(st.just("delete"), st.sampled_from(_SESSIONS)),
    st.tuples(st.just("clear")),
    st.tuples(st.just("purge")),
    st.tuples(st.just("tick"), st.sampled_from([1.0, 4.0, 10.0])),
    st.tuples(st.just("reopen")),
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    ttl=st.sampled_from([None, 5.0]),
    max_messages=st.sampled_from([None, 1, 3]),
    operations=st.lists(_operations, max_size=14),
)
def test_behaves_like_the_in_memory_store(
    tmp_path_factory: pytest.TempPathFactory,
    ttl: float | None,
    max_messages: int | None,
    operations: list[tuple[Any, ...]],
) -> None:
    clock = FakeClock()
    path = tmp_path_factory.mktemp("differential") / "s.json"
    reference = InMemoryStore(ttl=ttl, max_messages=max_messages, clock=clock)
    store = JSONFileStore(path, ttl=ttl, max_messages=max_messages, clock=clock)
    # A read of an expired session forgets it in memory but does not write (reads never do),
    # so a store opened later still finds it in the file and purges it: purge counts match
    # while the same store object has been in use since the last write.
    same_store = True
    for op, *args in operations:
        if op == "append":
            session_id, batch, counters, seed = args
            tokens = {c: [seed + i for i in range(len(batch))] for c in sorted(counters)}
            for s in (reference, store):
                s.append(session_id, batch, tokens)
            same_store = True
        elif op == "metadata":
            for s in (reference, store):
                s.update_metadata(args[0], args[1])
            same_store = True
        elif op == "delete":
            assert store.delete_session(args[0]) == reference.delete_session(args[0])
        elif op == "clear":
            for s in (reference, store):
                s.clear()
            same_store = True
        elif op == "purge":
            purged = store.purge_expired(), reference.purge_expired()
            assert purged[0] == purged[1] or not same_store
        elif op == "tick":
            clock.advance(args[0])
        else:
            store.close()
            store = JSONFileStore(path, ttl=ttl, max_messages=max_messages, clock=clock)
            same_store = False
        for session_id in _SESSIONS:
            assert reads(store, session_id) == reads(reference, session_id)
    store.close()


# -- several stores over one file ----------------------------------------------------------------


def test_a_rewrite_is_seen_even_when_the_file_looks_unchanged(path: Path) -> None:
    a, b = JSONFileStore(path), JSONFileStore(path)
    a.update_metadata("s", {"n": 1})
    assert b.get_metadata("s") == {"n": 1}
    a.update_metadata("s", {"n": 2})  # same size; maybe the same mtime tick and a reused inode
    # Make b believe the file's signature has not changed since it read it: only the write
    # token in the lock file tells it that another store wrote.
    st_ = path.stat()
    b._seen = (st_.st_dev, st_.st_ino, st_.st_size, st_.st_mtime_ns)
    assert b.get_metadata("s") == {"n": 2}


def test_alternating_same_size_writes_are_all_seen(path: Path) -> None:
    a, b = JSONFileStore(path), JSONFileStore(path)
    for i in range(30):
        writer, reader = (a, b) if i % 2 else (b, a)
        writer.update_metadata("s", {"n": i % 10})
        assert reader.get_metadata("s") == {"n": i % 10}


def test_an_external_edit_is_seen(path: Path) -> None:
    store = JSONFileStore(path)
    store.append("s", [Message(Role.USER, "hi")])
    document = json.loads(path.read_bytes())
    document["sessions"]["s"]["messages"][0]["content"] = "edited by hand"
    path.write_text(json.dumps(document, indent=2))
    assert store.history("s") == [Message(Role.USER, "edited by hand")]


def _append_from_threads(stores: list[JSONFileStore], batches: int) -> None:
    barrier = threading.Barrier(len(stores))
    errors: list[BaseException] = []

    def write(w: int) -> None:
        try:
            barrier.wait()
            for b in range(batches):
                stores[w].append("shared", tagged_batch(w, b, 2), tagged_tokens(w, b, 2))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_threads_with_a_store_each_lose_nothing(path: Path) -> None:
    writers, batches = 4, 25
    _append_from_threads([JSONFileStore(path) for _ in range(writers)], batches)
    check = JSONFileStore(path)
    history = check.history("shared")
    assert len(history) == writers * batches * 2
    check_batches(history, writers, batches, check.tail("shared", None, "tag").tokens)


def test_without_fcntl_stores_of_one_process_still_share_a_lock(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(json_store, "fcntl", None)
    writers, batches = 4, 25
    _append_from_threads([JSONFileStore(path) for _ in range(writers)], batches)
    check = JSONFileStore(path)
    check_batches(
        check.history("shared"), writers, batches, check.tail("shared", None, "tag").tokens
    )


def _in_child(body: Callable[[], bool]) -> bool:
    """Run ``body`` in a forked child; whether it returned True."""
    pid = os.fork()
    if pid == 0:  # the child reports through its exit code
        ok = False
        try:
            ok = body()
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


@posix_only
def test_a_forked_child_takes_a_lock_of_its_own(path: Path) -> None:
    import fcntl

    store = JSONFileStore(path)
    store.append("s", [Message(Role.USER, "parent")])
    parent_fd = store._lock_fd
    assert parent_fd is not None
    fcntl.flock(parent_fd, fcntl.LOCK_EX)  # as if the parent were writing

    def locked_out() -> bool:
        # An inherited descriptor would share the parent's lock and get it at once.
        fd = store._open_lock_file(True)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False

    try:
        assert _in_child(locked_out)
    finally:
        fcntl.flock(parent_fd, fcntl.LOCK_UN)

    def append() -> bool:
        store.append("s", [Message(Role.USER, "child")])
        return True

    assert _in_child(append)
    store.append("s", [Message(Role.USER, "parent again")])
    assert [m.content for m in JSONFileStore(path).history("s")] == [
        "parent",
        "child",
        "parent again",
    ]


def test_a_memory_rebuilt_over_the_file_gives_the_same_context(path: Path) -> None:
    def memory() -> ConversationBufferWindowMemory:
        return ConversationBufferWindowMemory(k=2, store=JSONFileStore(path), session_id="chat")

    first = memory()
    first.add_message({"role": "system", "content": "Be brief."})
    first.save_context({"input": "Hi, I'm Ada."}, {"output": "Hello Ada!"})
    first.add_messages(rich_messages()[1:])
    first.save_context({"input": "Thanks"}, {"output": "Any time."})
    restarted = memory()
    assert restarted.get_context() == first.get_context()
    assert len(restarted.get_context()) == 1 + 5 + 2  # the system prompt, the last 2 turns
    assert restarted.get_history() == first.get_history()
    assert restarted.load_memory_variables() == first.load_memory_variables()
    assert asyncio.run(restarted.aget_context()) == first.get_context()


def test_a_rebuilt_token_memory_does_not_count_again(path: Path) -> None:
    calls = [0]

    def length(text: str) -> int:
        calls[0] += 1
        return len(text.split()) + 1

    def memory() -> ConversationTokenBufferMemory:
        counter = CallableCounter(length, name="words")
        return ConversationTokenBufferMemory(
            60, token_counter=counter, store=JSONFileStore(path), session_id="chat"
        )

    first = memory()
    for i in range(6):
        first.save_context({"input": f"question {i} " * 3}, {"output": f"answer {i} " * 4})
    first.add_messages(rich_messages()[1:])
    context, stats = first.get_context(), first.get_memory_stats()
    assert "words" in json.loads(path.read_bytes())["sessions"]["chat"]["tokens"]
    calls[0] = 0
    restarted = memory()
    assert restarted.get_context() == context
    assert restarted.get_memory_stats() == stats
    assert calls[0] == 0


# -- atomic writes -------------------------------------------------------------------------------


@pytest.mark.parametrize("failing", ["urandom", "fsync", "replace"])
def test_a_failed_write_leaves_the_old_file(
    path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    store = JSONFileStore(path)
    store.append("s", [Message(Role.USER, "kept")])
    before = path.read_bytes()
    failure = OSError(errno.EIO, "disk on fire")

    def fail(*args: Any) -> None:
        raise failure

    monkeypatch.setattr(os, failing, fail)
    with pytest.raises(StoreUnavailableError, match=re.escape(str(path))) as caught:
        store.append("s", [Message(Role.USER, "lost")])
    assert caught.value.__cause__ is failure
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert temp_files(path.parent) == []
    # Neither this store nor a new one shows the batch that was not written.
    assert store.history("s") == [Message(Role.USER, "kept")]
    assert JSONFileStore(path).history("s") == [Message(Role.USER, "kept")]
    store.append("s", [Message(Role.USER, "next")])
    assert JSONFileStore(path).history("s") == [
        Message(Role.USER, "kept"),
        Message(Role.USER, "next"),
    ]


def test_stale_temporary_files_are_ignored_then_removed(path: Path) -> None:
    store = JSONFileStore(path)
    store.append("s", [Message(Role.USER, "hi")])
    folder = path.parent
    torn = path.read_bytes()[:20]
    (folder / f".{path.name}.4242.deadbeef.tmp").write_bytes(torn)
    (folder / f".{path.name}.99.0123abcd.tmp").write_bytes(b"\x00garbage")
    unrelated = [f".{path.name}.notes.tmp", "other.json.1.deadbeef.tmp", "keep.tmp"]
    for name in unrelated:
        (folder / name).write_text("not ours")
    fresh = JSONFileStore(path)
    assert fresh.history("s") == [Message(Role.USER, "hi")]
    fresh.append("s", [Message(Role.ASSISTANT, "hello")])
    assert temp_files(folder) == sorted(unrelated)
    assert JSONFileStore(path).history("s")[-1] == Message(Role.ASSISTANT, "hello")


# -- corrupt files -------------------------------------------------------------------------------


def _document(**session_changes: Any) -> dict[str, Any]:
    session = {
        "created_at": 1.0,
        "updated_at": 2.0,
        "metadata": {},
        "tokens": {"x": [1, 2]},
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
    }
    session.update(session_changes)
    return {"format": "zerda-json", "version": 1, "sessions": {"s": session}}


def _bytes(document: Any) -> bytes:
    return json.dumps(document).encode()


CORRUPT = {
    "empty": b"",
    "not json": b"{not json",
    "torn": _bytes(_document())[:40],
    "not utf-8": b'{"format": "zerda-json\xff\xfe"}',
    "a list": b"[]",
    "another format": _bytes({**_document(), "format": "other"}),
    "no format": _bytes({"sessions": {}}),
    "a newer version": _bytes({**_document(), "version": 2}),
    "unknown key": _bytes({**_document(), "extra": 1}),
    "sessions not an object": _bytes({**_document(), "sessions": []}),
    "hostile session id": _bytes(
        {**_document(), "sessions": {"'; DROP TABLE x; --": _document()["sessions"]["s"]}}
    ),
    "session not an object": _bytes({**_document(), "sessions": {"s": [1]}}),
    "unknown session key": _bytes(_document(extra=1)),
    "no created_at": _bytes(_document(created_at=None)),
    "messages not a list": _bytes(_document(messages={})),
    "bad role": _bytes(_document(messages=[{"role": "wizard", "content": "hi"}], tokens={})),
    "message not an object": _bytes(_document(messages=["hi"], tokens={})),
    "tool call without id": _bytes(
        _document(
            messages=[{"role": "assistant", "content": None, "tool_calls": [{"type": "x"}]}],
            tokens={},
        )
    ),
    "counts too short": _bytes(_document(tokens={"x": [1]})),
    "count not an int": _bytes(_document(tokens={"x": [1, 2.5]})),
    "count a bool": _bytes(_document(tokens={"x": [1, True]})),
    "metadata not an object": _bytes(_document(metadata=[1])),
    "NaN": _bytes(_document()).replace(b'"updated_at": 2.0', b'"updated_at": NaN'),
}


@pytest.mark.parametrize("content", list(CORRUPT.values()), ids=list(CORRUPT))
def test_a_corrupt_file_is_reported_and_left_untouched(path: Path, content: bytes) -> None:
    path.write_bytes(content)
    store = JSONFileStore(path)
    calls: list[Callable[[], object]] = [
        lambda: store.history("s"),
        lambda: store.tail("s", 2, "x"),
        lambda: store.get_metadata("s"),
        lambda: store.list_sessions(),
        lambda: store.append("s", [Message(Role.USER, "new")]),
        lambda: store.update_metadata("s", {"k": 1}),
        lambda: store.delete_session("s"),
        lambda: store.clear(),
        lambda: store.purge_expired(),
    ]
    for call in calls:
        with pytest.raises(CorruptDataError, match=re.escape(str(path))):
            call()
        assert path.read_bytes() == content
    assert temp_files(path.parent) == []
    # Repaired, the file works again with the same store.
    path.write_bytes(_bytes(_document()))
    assert [m.content for m in store.history("s")] == ["hi", "yo"]


def test_the_valid_document_used_above_is_valid(path: Path) -> None:
    path.write_bytes(_bytes(_document()))
    tail = JSONFileStore(path).tail("s", None, "x")
    assert [m.content for m in tail.messages] == ["hi", "yo"]
    assert list(tail.tokens) == [1, 2]


# -- crashes -------------------------------------------------------------------------------------

_APPEND_FOREVER = """
import sys
from zerda.messages import Message, Role
from zerda.stores import JSONFileStore

store = JSONFileStore(sys.argv[1])
pad = "x" * 400
b = 0
while True:
    batch = [Message(Role.USER, f"{b}:0:{pad}")] + [
        Message(Role.ASSISTANT, f"{b}:{i}") for i in (1, 2)
    ]
    store.append("s", batch, {"n": [b, b, b]})
    print(b, flush=True)
    b += 1
"""


def _check_numbered_batches(store: JSONFileStore, acknowledged: int) -> int:
    """Every batch up to ``acknowledged`` is stored whole and in order; how many are."""
    history = store.history("s")
    tokens = store.tail("s", None, "n").tokens
    assert len(history) % 3 == 0, "a torn batch"
    count = len(history) // 3
    assert count >= acknowledged + 1, "an acknowledged batch was lost"
    assert count <= acknowledged + 2, "more batches than were written"
    for b in range(count):
        parts = [(m.content or "").split(":")[:2] for m in history[3 * b : 3 * b + 3]]
        assert parts == [[str(b), "0"], [str(b), "1"], [str(b), "2"]]
        assert list(tokens[3 * b : 3 * b + 3]) == [b, b, b]
    return count


@posix_only
def test_sigkill_while_writing_loses_no_acknowledged_batch(path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _APPEND_FOREVER, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        acknowledged = -1
        while acknowledged < 40:
            line = child.stdout.readline()
            assert line, f"the writer died: {child.communicate()[1]}"
            acknowledged = int(line)
        # Kill it in the middle of a write: as soon as its temporary file exists.
        while not temp_files(path.parent):
            assert child.poll() is None, f"the writer died: {child.communicate()[1]}"
        child.send_signal(signal.SIGKILL)
        child.wait()
        # Read through the file object, not communicate(), which reads the pipe itself and
        # would miss lines readline() has already buffered here.
        rest = child.stdout.read()
    finally:
        child.kill()
        child.communicate()
    assert child.returncode == -signal.SIGKILL
    # Every batch it printed was acknowledged, including those printed after the last read.
    acknowledged = int((line + rest).split()[-1])
    store = JSONFileStore(path)
    _check_numbered_batches(store, acknowledged)
    store.append("s", [])  # and the store takes writes again, leaving no temporary file
    assert temp_files(path.parent) == []


_DIE_WHILE_WRITING = """
import os, signal, sys
from zerda.messages import Message, Role
from zerda.stores import JSONFileStore

path, point, batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = JSONFileStore(path)
for b in range(batches):
    store.append("s", [Message(Role.USER, f"{b}:0")] + [
        Message(Role.ASSISTANT, f"{b}:{i}") for i in (1, 2)
    ], {"n": [b, b, b]})
    print(b, flush=True)

def die(*args):
    os.kill(os.getpid(), signal.SIGKILL)

setattr(os, point, die)  # the next write dies there, its temporary file written
store.append("s", [Message(Role.USER, "never acknowledged")])
"""


@posix_only
@pytest.mark.parametrize("point", ["fsync", "replace"])
def test_killed_between_temporary_file_and_rename(path: Path, point: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _DIE_WHILE_WRITING, str(path), point, "5"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert done.stdout.split() == ["0", "1", "2", "3", "4"]
    assert len(temp_files(path.parent)) == 1  # left by the killed writer
    store = JSONFileStore(path)
    assert _check_numbered_batches(store, 4) == 5
    store.append("s", [])
    assert temp_files(path.parent) == []

"""RedisStore and AsyncRedisStore: the store contract on a real Redis, and what only Redis shows."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import itertools
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("redis", reason="the redis extra is not installed")

import redis
import redis.asyncio
import redis.asyncio.connection
import redis.connection
from redis.crc import key_slot

from _conversations import conversation
from _processes import run_processes
from _redis_servers import RedisServer, drop_keys, free_port, fresh_prefix
from services import require_redis
from stores.contract import AsyncStoreContract, StoreContract, native_async_reading_what_sync_wrote
from zerda import ApproxCounter
from zerda.errors import (
    ConfigurationError,
    CorruptDataError,
    StoreUnavailableError,
    ZerdaError,
)
from zerda.memory import (
    ConversationBufferMemory,
    ConversationBufferWindowMemory,
    ConversationTokenBufferMemory,
)
from zerda.messages import Message, Role
from zerda.stores import (
    AsyncRedisStore,
    AsyncStore,
    InMemoryStore,
    RedisStore,
    Store,
    open_store,
)
from zerda.stores._base import canonical_json
from zerda.stores._redis import EXPIRE_MARGIN, SCRIPTS, open_redis_url

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "coffee-order.jsonl"
SUFFIXES = ("meta", "log", "system", "ids")
SHAS = {name: hashlib.sha1(source.encode()).hexdigest() for name, source in SCRIPTS.items()}


def drop_url_keys(url: str, prefix: str) -> None:
    """Delete every key under ``prefix`` on the server at ``url``."""
    client = redis.Redis.from_url(url)
    try:
        drop_keys(client, prefix)
    finally:
        client.close()


@pytest.fixture
def url() -> str:
    return require_redis()


@pytest.fixture
def prefix(url: str) -> Iterator[str]:
    name = fresh_prefix()
    yield name
    drop_url_keys(url, name)


@pytest.fixture
def raw(url: str) -> Iterator[Any]:
    """A plain client, to look at (or damage) the keys behind a store's back."""
    client = redis.Redis.from_url(url)
    yield client
    client.close()


# -- the contract --------------------------------------------------------------------------------


class _RedisContract:
    """A fresh key prefix for every store a test makes; the test's keys deleted at its end."""

    url: str
    base: str

    @pytest.fixture(autouse=True)
    def _redis_env(self) -> Iterator[None]:
        self.url = require_redis()
        self.base = fresh_prefix()
        self._made = itertools.count()
        yield
        drop_url_keys(self.url, self.base)

    def next_prefix(self) -> str:
        return f"{self.base}.{next(self._made)}"

    def reopen_recipe(self, store: Any) -> tuple[str, dict[str, Any]]:
        return f"zerda.stores:{type(store).__name__}", {"url": self.url, "prefix": store.prefix}


class TestRedisStore(_RedisContract, StoreContract):
    supports_processes = True

    def make_store(
        self, *, ttl: float | None, max_messages: int | None, clock: Callable[[], float]
    ) -> RedisStore:
        return RedisStore(
            self.url, prefix=self.next_prefix(), ttl=ttl, max_messages=max_messages, clock=clock
        )


class TestAsyncRedisStore(_RedisContract, AsyncStoreContract):
    supports_processes = True

    def make_store(
        self, *, ttl: float | None, max_messages: int | None, clock: Callable[[], float]
    ) -> AsyncRedisStore:
        return AsyncRedisStore(
            self.url, prefix=self.next_prefix(), ttl=ttl, max_messages=max_messages, clock=clock
        )


class TestRedisStoreOverADecodingClient(_RedisContract, StoreContract):
    """A client given by the user, made with ``decode_responses=True`` (replies are str) and
    speaking RESP2 (redis-py 8 defaults to RESP3)."""

    def make_store(
        self, *, ttl: float | None, max_messages: int | None, clock: Callable[[], float]
    ) -> RedisStore:
        client = redis.Redis.from_url(self.url, decode_responses=True, protocol=2)
        self._clients.append(client)
        return RedisStore(
            client=client,
            prefix=self.next_prefix(),
            ttl=ttl,
            max_messages=max_messages,
            clock=clock,
        )

    @pytest.fixture(autouse=True)
    def _clients_closed(self) -> Iterator[None]:
        self._clients: list[Any] = []
        yield
        for client in self._clients:
            client.close()


# -- round trips ---------------------------------------------------------------------------------


class CountingConnection(redis.connection.Connection):
    """Records what each packet sent holds: one packet, one round trip."""

    packets: list[list[str]] = []  # noqa: RUF012 - shared by one test's connections

    def send_command(self, *args: Any, **kwargs: Any) -> None:
        CountingConnection.packets.append([str(args[0]).upper()])
        super().send_command(*args, **kwargs)

    def pack_commands(self, commands: Any) -> Any:
        commands = list(commands)
        CountingConnection.packets.append([str(c[0]).upper() for c in commands])
        return super().pack_commands(commands)


class AsyncCountingConnection(redis.asyncio.connection.Connection):
    packets: list[list[str]] = []  # noqa: RUF012

    async def send_command(self, *args: Any, **kwargs: Any) -> None:
        AsyncCountingConnection.packets.append([str(args[0]).upper()])
        await super().send_command(*args, **kwargs)

    def pack_commands(self, commands: Any) -> Any:
        commands = list(commands)
        AsyncCountingConnection.packets.append([str(c[0]).upper() for c in commands])
        return super().pack_commands(commands)


APPEND = [["EVALSHA"]]
SCRIPT = [["EVALSHA"]]
TAIL_OF_NONE = [["MULTI", "HGETALL", "LLEN", "LRANGE", "EXEC"]]
TAIL = [["MULTI", "HGETALL", "LLEN", "LRANGE", "LRANGE", "EXEC"]]
APPEND_THEN_TAIL = [["MULTI", "EVALSHA", *TAIL[0][1:]]]
METADATA = [["HGETALL"]]


def stamped(messages: list[Message]) -> list[Message]:
    """The messages with ids (and times), as a memory stores them."""
    return [m.stamped() for m in messages]


def test_every_call_is_one_round_trip(url: str, prefix: str) -> None:
    pool = redis.ConnectionPool.from_url(url, connection_class=CountingConnection)
    client = redis.Redis(connection_pool=pool)
    store = RedisStore(client=client, prefix=prefix, ttl=3600, max_messages=50)
    store.tail("s", 1)  # connects (HELLO, CLIENT SETINFO)
    store.append("s", [Message(Role.USER, "warm up")], {"x": [1]})  # loads the scripts
    packets = CountingConnection.packets
    for t in range(40):
        turn = stamped(conversation(3)[1:])
        packets.clear()
        assert store.append("s", turn, {"x": list(range(len(turn)))}) == len(turn)
        assert packets == APPEND, t  # retention trims after 50 messages
        packets.clear()
        assert store.append("s", turn, {"x": list(range(len(turn)))}) == 0
        assert packets == APPEND, "a retry of a stored batch"
        for turns in (None, 0, 3):
            packets.clear()
            store.tail("s", turns, "x")
            assert packets == (TAIL_OF_NONE if turns == 0 else TAIL), (t, turns)
        packets.clear()
        stored, tail = store.append_then_tail("s", stamped(conversation(1)[1:]), None, 2, "x")
        assert (stored, tail.total_turns > 2) == (2, True)
        assert packets == APPEND_THEN_TAIL
        packets.clear()
        assert store.compare_and_set("s", "zerda.n", t or None, t + 1)
        assert store.compare_and_set("s", "zerda.n", t, t + 2) is False
        assert packets == SCRIPT * 2
        packets.clear()
        store.update_metadata("s", {"k": t})
        assert packets == SCRIPT
        packets.clear()
        assert store.get_metadata("s") == {"k": t, "zerda.n": t + 1}
        assert packets == METADATA
    # A batch of which the session holds some messages: sent again without them.
    held = stamped(conversation(2)[1:])
    store.append("s", held[:2])
    packets.clear()
    assert store.append("s", held) == len(held) - 2
    assert packets == APPEND * 2
    assert store.history("s")[-len(held) :] == held
    # Through a memory: a turn saved is one call, a window context read is one.
    memory = ConversationBufferWindowMemory(k=3, store=store, session_id="m")
    packets.clear()
    memory.save_context({"input": "hi"}, {"output": "hello"})
    assert len(packets) == 1, packets
    packets.clear()
    memory.load_memory_variables({})
    assert len(packets) == 1, packets
    store.close()
    client.close()


def test_every_async_call_is_one_round_trip(url: str, prefix: str) -> None:
    async def main() -> None:
        pool = redis.asyncio.ConnectionPool.from_url(url, connection_class=AsyncCountingConnection)
        client = redis.asyncio.Redis(connection_pool=pool)
        store = AsyncRedisStore(client=client, prefix=prefix, ttl=3600)
        await store.atail("s", 1)
        await store.aappend("s", [Message(Role.USER, "warm up")])
        packets = AsyncCountingConnection.packets
        for turn in (stamped(conversation(4)[1:4]), stamped(conversation(4)[4:])):
            packets.clear()
            assert await store.aappend("s", turn) == len(turn)
            assert packets == APPEND
            packets.clear()
            await store.atail("s", 2)
            assert packets == TAIL
            packets.clear()
            stored, tail = await store.aappend_then_tail("s", turn, None, None)
            assert (stored, list(tail.messages[-len(turn) :])) == (0, turn)
            assert packets == APPEND_THEN_TAIL
            packets.clear()
            current = (await store.aget_metadata("s")).get("zerda.n")
            assert await store.acompare_and_set("s", "zerda.n", current, (current or 0) + 1)
            await store.aupdate_metadata("s", {"k": 1})
            assert packets == METADATA + SCRIPT * 2
        await store.aclose()
        await client.aclose()

    asyncio.run(main())


# -- keys ----------------------------------------------------------------------------------------


def test_every_key_carries_the_session_hash_tag(url: str, prefix: str, raw: Any) -> None:
    store = RedisStore(url, prefix=prefix, ttl=600, max_messages=4)
    ids = ["a", "tenant:user@example.com", "b.1", "x" * 200]
    for session_id in ids:
        store.append(session_id, stamped(conversation(5)))
        store.update_metadata(session_id, {"summary": "so far"})
    keys = sorted(k.decode() for k in raw.scan_iter(match=f"{prefix}*", count=1000))
    pattern = re.compile(rf"{re.escape(prefix)}:\{{([^{{}}]+)\}}:({'|'.join(SUFFIXES)})")
    by_session: dict[str, set[str]] = {}
    for key in keys:
        match = pattern.fullmatch(key)
        assert match is not None, key
        by_session.setdefault(match.group(1), set()).add(match.group(2))
    assert by_session == {s: set(SUFFIXES) for s in ids}
    for session_id in ids:
        slots = {key_slot(f"{prefix}:{{{session_id}}}:{s}".encode()) for s in SUFFIXES}
        assert len(slots) == 1, "one session, one cluster slot"
    store.close()


def test_the_prefix_keeps_stores_apart(url: str, raw: Any) -> None:
    first, second = fresh_prefix(), fresh_prefix()
    try:
        one = RedisStore(url, prefix=first)
        two = RedisStore(url, prefix=second)
        one.append("s", [Message(Role.USER, "one")])
        two.append("s", [Message(Role.USER, "two")])
        two.append("t", [Message(Role.USER, "two")])
        assert [m.content for m in one.history("s")] == ["one"]
        assert [i.session_id for i in one.list_sessions()] == ["s"]
        assert [i.session_id for i in two.list_sessions()] == ["s", "t"]
        one.clear()
        assert one.list_sessions() == []
        assert [m.content for m in two.history("s")] == ["two"]
        assert list(raw.scan_iter(match=f"{first}*")) == []
        # meta and log each: no system message, no id
        assert len(list(raw.scan_iter(match=f"{second}*"))) == 2 * 2
        one.close()
        two.close()
    finally:
        drop_url_keys(url, first)
        drop_url_keys(url, second)


def test_the_default_prefix_is_zerda(url: str) -> None:
    store = RedisStore(url)  # no I/O here: nothing is written under the shared default prefix
    assert store.prefix == "zerda"
    store.close()


@pytest.mark.parametrize("bad", ["", "a{b", "a}b", "a*", "a?", "a[b]", "a b", "x" * 101, 5, None])
def test_a_bad_prefix_is_refused(url: str, bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="prefix"):
        RedisStore(url, prefix=bad)


# -- server-side expiry --------------------------------------------------------------------------


def test_writes_set_and_refresh_redis_expiry_and_reads_do_not(
    url: str, prefix: str, raw: Any
) -> None:
    ttl = 100
    full = (ttl + EXPIRE_MARGIN) * 1000
    store = RedisStore(url, prefix=prefix, ttl=ttl)
    store.append("s", stamped(conversation(2)))
    keys = [f"{prefix}:{{s}}:{suffix}" for suffix in SUFFIXES]
    for key in keys:
        assert full - 10_000 < raw.pttl(key) <= full, key
    for key in keys:
        raw.pexpire(key, 5000)
    store.tail("s", None)
    store.history("s")
    store.get_metadata("s")
    store.list_sessions()
    assert store.compare_and_set("s", "k", "not this", 1) is False  # writes nothing
    assert all(0 < raw.pttl(key) <= 5000 for key in keys), "a read pushed the expiry back"
    writes: list[Callable[[], object]] = [
        lambda: store.update_metadata("s", {"k": 1}),
        lambda: store.compare_and_set("s", "zerda.k", None, 1),
        lambda: store.append("s", [Message(Role.USER, "again")]),
        lambda: store.append_then_tail("s", [Message(Role.USER, "and again")], None, 1),
    ]
    for write in writes:  # each pushes every key's expiry back
        for key in keys:
            raw.pexpire(key, 5000)
        write()
        assert all(full - 10_000 < raw.pttl(key) <= full for key in keys)
    store.close()


def test_without_ttl_keys_do_not_expire(url: str, prefix: str, raw: Any) -> None:
    store = RedisStore(url, prefix=prefix)
    store.append("s", stamped(conversation(2)))
    store.update_metadata("s", {"k": 1})
    assert store.compare_and_set("s", "zerda.k", None, 1)
    assert [raw.pttl(f"{prefix}:{{s}}:{s}") for s in SUFFIXES] == [-1] * len(SUFFIXES)
    store.close()


def test_a_session_redis_dropped_in_part_starts_afresh(url: str, prefix: str, raw: Any) -> None:
    """Keys evicted apart (a maxmemory policy) leave no stale remains behind the next write."""
    store = RedisStore(url, prefix=prefix)
    store.append("s", conversation(3))
    raw.delete(f"{prefix}:{{s}}:meta")
    assert store.history("s") == []
    store.append("s", [Message(Role.USER, "fresh")])
    assert [m.content for m in store.history("s")] == ["fresh"]
    assert store.tail("s", None).total_messages == 1
    store.close()


# -- retention -----------------------------------------------------------------------------------


def test_retention_trims_the_lists_themselves(url: str, prefix: str, raw: Any) -> None:
    keep = 6
    store = RedisStore(url, prefix=prefix, max_messages=keep)
    reference = InMemoryStore(max_messages=keep)
    log, meta, ids = (f"{prefix}:{{s}}:{suffix}" for suffix in ("log", "meta", "ids"))
    for t, message in enumerate(stamped(conversation(60))):
        for s in (store, reference):
            s.append("s", [message], {"x": [t]})
        # Whole turns go: what stays is at most the limit plus one turn (4 messages here).
        kept = sum(int(e.split(b",")[0]) for e in raw.lrange(log, 0, -1))
        assert kept == int(raw.hget(meta, "count")) <= keep + 3
        assert raw.llen(log) <= keep
        # The ids go with their messages: the set holds those of the history, no more.
        history = store.history("s")
        assert {i.decode() for i in raw.zrange(ids, 0, -1)} == {m.id for m in history}
    pinned = history[0]
    assert (pinned.role, raw.zscore(ids, pinned.id)) == (Role.SYSTEM, float("inf"))
    assert store.history("s") == reference.history("s")
    assert store.history("s")[0].role is Role.SYSTEM, "the system prompt is kept"
    tail, expected = store.tail("s", None, "x"), reference.tail("s", None, "x")
    assert (list(tail.messages), list(tail.tokens)) == (
        list(expected.messages),
        list(expected.tokens),
    )
    store.close()


# -- failures ------------------------------------------------------------------------------------


SECRET = "Hunter2-secret"
# Every form of a Redis URL with a password in it.
WITH_PASSWORD = [
    "redis://:{pw}@127.0.0.1:{port}/0",
    "redis://user:{pw}@127.0.0.1:{port}/0",
    "redis://127.0.0.1:{port}/0?password={pw}",
    "redis://127.0.0.1:{port}/0?socket_timeout=3&password={pw}",
    "rediss://u:{pw}@127.0.0.1:{port}",
    "redis+cluster://:{pw}@127.0.0.1:{port}",
]
# redis-py's query keys are lowercase: these are refused, without showing the password.
WITH_PASSWORD_KEY_IN_ANOTHER_CASE = [
    "redis://127.0.0.1:{port}/0?PassWord={pw}",
    "redis://127.0.0.1:{port}/0?db=1&PASSWORD={pw}",
    "redis+cluster://127.0.0.1:{port}?Password={pw}",
]


def every_call(store: RedisStore) -> list[Callable[[], object]]:
    return [
        lambda: store.append("s", [Message(Role.USER, "hi")]),
        lambda: store.append_then_tail("s", [Message(Role.USER, "hi")], None, 1),
        lambda: store.tail("s", 1),
        lambda: store.history("s"),
        lambda: store.get_metadata("s"),
        lambda: store.update_metadata("s", {"k": 1}),
        lambda: store.compare_and_set("s", "k", None, 1),
        store.list_sessions,
        lambda: store.delete_session("s"),
        store.clear,
        store.purge_expired,
    ]


@pytest.mark.parametrize("form", WITH_PASSWORD)
def test_a_dead_server_is_store_unavailable_and_no_output_shows_the_password(form: str) -> None:
    port = free_port()
    store = RedisStore(form.format(pw=SECRET, port=port), prefix="unused", ttl=60, timeout=2)
    assert SECRET not in repr(store)
    assert SECRET not in store.url
    assert f"127.0.0.1:{port}" in store.url
    for call in every_call(store):
        with pytest.raises(StoreUnavailableError) as info:
            call()
        assert f"127.0.0.1:{port}" in str(info.value)
        assert SECRET not in str(info.value)
        assert isinstance(
            info.value.__cause__,
            (redis.exceptions.RedisError, redis.exceptions.RedisClusterException),
        )
    store.close()


@pytest.mark.parametrize("form", WITH_PASSWORD_KEY_IN_ANOTHER_CASE)
def test_a_password_key_in_another_case_is_refused_without_showing_it(form: str) -> None:
    for store_class in (RedisStore, AsyncRedisStore):
        with pytest.raises(ConfigurationError) as info:
            store_class(form.format(pw=SECRET, port=6379))
        assert SECRET not in str(info.value)
        assert "password=***" in str(info.value).lower()


def test_a_server_that_refuses_the_password_never_shows_it(
    start_redis: Callable[..., RedisServer],
) -> None:
    server = start_redis(extra=["--requirepass", "the-right-one"])
    for form in WITH_PASSWORD[:4]:
        store = RedisStore(form.format(pw=SECRET, port=server.port), prefix="unused")
        with pytest.raises(StoreUnavailableError) as info:
            store.tail("s", 1)
        assert isinstance(info.value.__cause__, redis.exceptions.AuthenticationError)
        assert SECRET not in str(info.value)
        store.close()


def test_a_dead_server_is_store_unavailable_for_the_async_store() -> None:
    port = free_port()

    async def main() -> None:
        for form in WITH_PASSWORD:
            target = form.format(pw=SECRET, port=port)
            async with AsyncRedisStore(target, prefix="x", timeout=2) as store:
                assert SECRET not in repr(store)
                assert SECRET not in store.url
                calls = [
                    store.aappend("s", [Message(Role.USER, "hi")]),
                    store.aappend_then_tail("s", [Message(Role.USER, "hi")], None, 1),
                    store.atail("s", 1),
                    store.acompare_and_set("s", "k", None, 1),
                    store.alist_sessions(),
                ]
                for call in calls:
                    with pytest.raises(StoreUnavailableError) as info:
                        await call
                    assert f"127.0.0.1:{port}" in str(info.value)
                    assert SECRET not in str(info.value)

    asyncio.run(main())


@pytest.mark.parametrize(
    "bad",
    [
        "redis://h:99999/0",
        "redis://[::1",
        "redis://h:port/0",
        "redis://h/zero",
        "redis://h/0?db=zero",
        "redis://h/0?socket_timeout=soon",
        "http://h:6379/0",
        "redis+cluster://h:6379/1",
        "",
    ],
)
def test_a_url_that_cannot_be_parsed_is_a_configuration_error(bad: str) -> None:
    for store_class in (RedisStore, AsyncRedisStore):
        with pytest.raises(ConfigurationError) as info:
            store_class(bad)
        assert type(info.value) is ConfigurationError
    with pytest.raises(ConfigurationError):
        open_redis_url(bad)
    with pytest.raises(ConfigurationError) as info:
        RedisStore(bad.replace("//h", f"//:{SECRET}@h"))
    assert SECRET not in str(info.value)


def test_a_batch_refused_inside_the_script_changes_nothing(url: str, prefix: str, raw: Any) -> None:
    store = RedisStore(url, prefix=prefix)
    store.append("s", conversation(2), {"x": [1] * len(conversation(2))})
    meta = f"{prefix}:{{s}}:meta"
    before = {s: raw.lrange(f"{prefix}:{{s}}:{s}", 0, -1) for s in SUFFIXES[1:]}
    raw.hset(meta, "count", "not a number")
    meta_before = raw.hgetall(meta)
    with pytest.raises(CorruptDataError, match="count"):
        store.append("s", conversation(3), {"x": [2] * len(conversation(3))})
    assert raw.hgetall(meta) == meta_before, "not even the update time moved"
    assert {s: raw.lrange(f"{prefix}:{{s}}:{s}", 0, -1) for s in SUFFIXES[1:]} == before
    assert store.delete_session("s") is True, "a damaged session can still be deleted"
    store.close()


def test_data_that_is_not_zerdas_is_corrupt_data(url: str, prefix: str, raw: Any) -> None:
    store = RedisStore(url, prefix=prefix)
    for session_id in ("entry", "counts", "element", "metadata", "wrongtype", "good"):
        store.append(session_id, [Message(Role.USER, "fine")], {"x": [1]})
        store.update_metadata(session_id, {"k": 1})
    raw.lset(f"{prefix}:{{entry}}:log", 0, b'1,0\0\n{"role": "wizard"}')
    raw.lset(f"{prefix}:{{counts}}:log", 0, b'1,0\0[1]\n{"role": "user", "content": "x"}')
    raw.rpush(f"{prefix}:{{element}}:log", b"no header\0here")
    raw.hset(f"{prefix}:{{metadata}}:meta", 'm:"k"', "{oops")
    raw.delete(f"{prefix}:{{wrongtype}}:log")
    raw.set(f"{prefix}:{{wrongtype}}:log", "a string")
    fresh = RedisStore(url, prefix=prefix)  # nothing decoded before
    for session_id in ("entry", "counts", "element"):
        with pytest.raises(CorruptDataError, match=f"'{session_id}'"):
            fresh.tail(session_id, None, "x")
    with pytest.raises(CorruptDataError, match="a log element"):
        fresh.append("element", [Message(Role.ASSISTANT, "continues the last turn")])
    with pytest.raises(CorruptDataError, match="'entry'"):
        fresh.history("entry")
    with pytest.raises(CorruptDataError, match="metadata"):
        fresh.get_metadata("metadata")
    with pytest.raises(CorruptDataError, match="WRONGTYPE"):
        fresh.tail("wrongtype", None)
    with pytest.raises(CorruptDataError, match="WRONGTYPE"):
        fresh.append("wrongtype", [Message(Role.USER, "more")])
    assert [m.content for m in fresh.history("good")] == ["fine"]
    assert fresh.get_metadata("good") == {"k": 1}
    store.close()
    fresh.close()


# -- construction --------------------------------------------------------------------------------


def test_options_are_checked(url: str) -> None:
    client = redis.Redis.from_url(url)
    async_client = redis.asyncio.Redis.from_url(url)
    with pytest.raises(ConfigurationError, match="exactly one"):
        RedisStore()
    with pytest.raises(ConfigurationError, match="exactly one"):
        RedisStore(url, client=client)
    with pytest.raises(ConfigurationError, match=r"redis\.Redis client"):
        RedisStore(client=async_client)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"redis\.asyncio\.Redis client"):
        AsyncRedisStore(client=client)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="URL"):
        RedisStore("http://localhost:6379")
    with pytest.raises(ConfigurationError, match="URL string"):
        RedisStore(b"redis://localhost")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="ttl"):
        AsyncRedisStore(url, ttl=0)
    client.close()
    asyncio.run(async_client.aclose())


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), True, "5", None])
def test_a_bad_timeout_is_refused(url: str, bad: Any) -> None:
    for store_class in (RedisStore, AsyncRedisStore):
        with pytest.raises(ConfigurationError, match="timeout"):
            store_class(url, timeout=bad)


def test_the_timeout_bounds_every_wait_of_the_client_a_store_makes(url: str) -> None:
    def waits(store: Any) -> tuple[float, float]:
        kwargs = store.client.connection_pool.connection_kwargs
        return kwargs["socket_connect_timeout"], kwargs["socket_timeout"]

    assert waits(RedisStore(url)) == (5.0, 5.0)
    assert waits(RedisStore(url, timeout=2.5)) == (2.5, 2.5)
    assert waits(AsyncRedisStore(url, timeout=0.5)) == (0.5, 0.5)
    separator = "&" if "?" in url else "?"
    # The URL's own settings win.
    assert waits(RedisStore(f"{url}{separator}socket_timeout=7", timeout=2)) == (2, 7)
    # No retries: a write whose reply was lost is the caller's to retry.
    assert RedisStore(url).client.get_retry().get_retries() == 0  # type: ignore[union-attr]


def test_a_given_client_is_not_closed_by_the_store(url: str, prefix: str) -> None:
    client = redis.Redis.from_url(url)
    with RedisStore(client=client, prefix=prefix) as store:
        store.append("s", [Message(Role.USER, "hi")])
        assert store.url == "redis://127.0.0.1:6379/0" or store.url.startswith("redis://")
    with pytest.raises(StoreUnavailableError, match="closed"):
        store.tail("s", 1)
    assert client.ping()
    assert [m.content for m in RedisStore(client=client, prefix=prefix).history("s")] == ["hi"]
    client.close()


def test_async_store_is_only_an_async_store(url: str) -> None:
    store = AsyncRedisStore(url)
    assert isinstance(store, AsyncStore)
    assert not isinstance(store, Store)
    assert not hasattr(store, "append")
    assert isinstance(RedisStore(url), Store)
    asyncio.run(store.aclose())


def test_an_async_store_refuses_a_second_event_loop_before_sending_anything(
    url: str, prefix: str
) -> None:
    store = AsyncRedisStore(url, prefix=prefix)
    asyncio.run(store.aappend("s", [Message(Role.USER, "first loop")]))
    with pytest.raises(ZerdaError, match="event loop"):
        asyncio.run(store.aappend("s", [Message(Role.USER, "second loop")]))
    asyncio.run(store.aclose())  # on another loop: marks it closed, touches nothing
    assert [m.content for m in RedisStore(url, prefix=prefix).history("s")] == ["first loop"]


def test_open_store_opens_redis_urls_with_a_prefix(url: str, prefix: str) -> None:
    separator = "&" if "?" in url else "?"
    store = open_store(f"{url}{separator}prefix={prefix}", ttl=60)
    assert isinstance(store, RedisStore)
    assert (store.prefix, store.ttl) == (prefix, 60)
    store.append("s", [Message(Role.USER, "via open_store")])
    assert [m.content for m in RedisStore(url, prefix=prefix).history("s")] == ["via open_store"]
    store.close()


def test_the_native_async_store_of_a_redis_url_reads_the_same_data(url: str, prefix: str) -> None:
    """What zerda serve answers through: the AsyncRedisStore of the same URL and prefix."""
    separator = "&" if "?" in url else "?"
    native = native_async_reading_what_sync_wrote(f"{url}{separator}prefix={prefix}")
    assert isinstance(native, AsyncRedisStore)
    assert native.prefix == prefix


# -- metadata: canonical JSON, compared as text or as JSON values --------------------------------


def test_metadata_is_stored_as_canonical_json(url: str, prefix: str, raw: Any) -> None:
    store = RedisStore(url, prefix=prefix)
    value = {"b": [1.0, "é \u2028", None], "a": 10**20, "f": 1e16}
    store.update_metadata("s", {"k": value})
    assert store.compare_and_set("s", "zerda.summary", None, {"turns": 2, "text": "t"})
    meta = f"{prefix}:{{s}}:meta"
    assert raw.hget(meta, 'm:"k"') == canonical_json(value).encode()
    assert raw.hget(meta, 'm:"zerda.summary"') == b'{"text":"t","turns":2}'
    store.close()


def test_compare_and_set_takes_values_an_older_zerda_wrote(url: str, prefix: str, raw: Any) -> None:
    """Older versions wrote ASCII JSON with keys in insertion order: the texts differ, the
    script compares the values."""
    store = RedisStore(url, prefix=prefix)
    store.append("s", [Message(Role.USER, "hi")])
    older = json.dumps({"turns": 3, "text": "café", "at": [1.5, {}]}, separators=(",", ":"))
    meta = f"{prefix}:{{s}}:meta"
    raw.hset(meta, 'm:"zerda.summary"', older)
    summary = store.get_metadata("s")["zerda.summary"]
    assert summary == {"turns": 3, "text": "café", "at": [1.5, {}]}
    assert store.compare_and_set("s", "zerda.summary", {**summary, "turns": 4}, "x") is False
    assert store.compare_and_set("s", "zerda.summary", {**summary, "at": [1.5, []]}, "x") is False
    assert store.compare_and_set("s", "zerda.summary", {**summary, "turns": 3.0}, {"turns": 4})
    assert raw.hget(meta, 'm:"zerda.summary"') == b'{"turns":4}'
    store.close()


@pytest.mark.parametrize(
    ("stored", "same", "other"),
    [
        pytest.param(10**40, 10**40, 10**40 + 1, id="big-ints"),
        pytest.param(2**60, 2.0**60, 2**60 + 1, id="int-and-float"),
        pytest.param(10**40, 10**40, 1e40, id="int-not-its-float"),
        pytest.param({"a": {}, "n": 1}, {"n": 1.0, "a": {}}, {"a": [], "n": 1}, id="empty-object"),
        pytest.param([[], 2], [[], 2.0], [{}, 2], id="empty-array"),
        pytest.param({"t": True}, {"t": True}, {"t": 1}, id="true-is-no-number"),
        pytest.param(0, -0.0, False, id="zeros"),
    ],
)
def test_compare_and_set_tells_apart_what_doubles_and_cjson_cannot(
    url: str, prefix: str, stored: Any, same: Any, other: Any
) -> None:
    """Lua decodes JSON numbers to doubles, and {} and [] alike: when that is all it sees,
    the store compares in Python, and sets the value only if the text is still the same."""
    from zerda.stores._base import same_json

    assert same_json(stored, same)
    assert not same_json(stored, other)
    store = RedisStore(url, prefix=prefix)
    assert store.compare_and_set("s", "k", None, stored)
    assert store.compare_and_set("s", "k", other, "no") is False
    assert canonical_json(store.get_metadata("s")["k"]) == canonical_json(stored)
    assert store.compare_and_set("s", "k", same, "yes") is True
    assert store.get_metadata("s") == {"k": "yes"}
    store.close()


# -- workers: stores, memories, processes ---------------------------------------------------------


def test_memories_over_two_stores_share_the_session(url: str, prefix: str) -> None:
    counter = ApproxCounter()
    one, two = RedisStore(url, prefix=prefix), RedisStore(url, prefix=prefix)
    first = ConversationTokenBufferMemory(90, token_counter=counter, store=one, session_id="c")
    for m in conversation(10):
        first.add_message(m)
    second = ConversationTokenBufferMemory(90, token_counter=counter, store=two, session_id="c")
    assert second.get_context() == first.get_context()
    assert second.get_memory_stats() == first.get_memory_stats()
    tail = two.tail("c", None, counter.name)
    assert None not in tail.tokens, "counts were stored with the messages"
    second.save_context({"input": "one more"}, {"output": "sure"})
    assert first.get_context()[-1].content == "sure"
    one.close()
    two.close()


def memory_writer(url: str, prefix: str, writer: int, turns: int, barrier: Any) -> None:
    """A spawned worker: its own store and memory, ``turns`` turns into the shared session."""
    store = RedisStore(url, prefix=prefix)
    memory = ConversationBufferMemory(store=store, session_id="shared")
    barrier.wait(60)
    for t in range(turns):
        memory.save_context({"input": f"{writer}:{t}"}, {"output": f"{writer}:{t}!"})
    store.close()


def test_four_processes_save_turns_through_memories_into_one_session(url: str, prefix: str) -> None:
    writers, turns = 4, 500
    run_processes(memory_writer, [(url, prefix, w, turns) for w in range(writers)])
    store = RedisStore(url, prefix=prefix)
    history = store.history("shared")
    assert len(history) == 2 * writers * turns
    seen: dict[int, list[int]] = {w: [] for w in range(writers)}
    for question, answer in zip(history[::2], history[1::2], strict=True):
        assert (question.role, answer.role) == (Role.USER, Role.ASSISTANT)
        assert answer.content == f"{question.content}!", "a turn was split"
        writer, t = map(int, (question.content or "").split(":"))
        seen[writer].append(t)
    assert seen == {w: list(range(turns)) for w in range(writers)}, "lost or out of order"
    assert store.tail("shared", 0).total_turns == writers * turns
    store.close()


# -- a private server, stopped hard in the middle of a run of writes ---------------------------


@pytest.fixture
def private_redis(start_redis: Callable[..., RedisServer]) -> RedisServer:
    """A redis-server of our own (never the machine's shared one), its append-only file
    fsynced on every write: a SIGKILL keeps every write it acknowledged."""
    return start_redis(durable=True)


def test_a_server_killed_mid_run_keeps_acknowledged_writes_and_the_memory_recovers(
    private_redis: RedisServer,
) -> None:
    store = RedisStore(private_redis.url, prefix="fault")
    memory = ConversationBufferWindowMemory(k=3, store=store, session_id="s")
    acked: list[int] = []
    failed: list[tuple[int, BaseException]] = []
    after: list[int] = []
    warmed, failing, recovered = threading.Event(), threading.Event(), threading.Event()
    restarted, stop = threading.Event(), threading.Event()
    problems: list[BaseException] = []

    def write() -> None:
        i = 0
        try:
            while not stop.is_set():
                try:
                    memory.save_context({"input": f"q{i}"}, {"output": f"a{i}"})
                except StoreUnavailableError as exc:
                    failed.append((i, exc))
                    if len(failed) >= 3:
                        failing.set()
                else:
                    acked.append(i)
                    if len(acked) >= 300:
                        warmed.set()
                    if restarted.is_set():
                        after.append(i)
                        if len(after) >= 100:
                            recovered.set()
                i += 1
        except BaseException as exc:
            problems.append(exc)
            for event in (warmed, failing, recovered):
                event.set()

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert warmed.wait(120)
        private_redis.kill()  # SIGKILL, in the middle of the writes
        assert failing.wait(120)
        with pytest.raises(StoreUnavailableError):
            memory.get_context()
        private_redis.start()  # same port, same folder: it replays its append-only file
        restarted.set()
        assert recovered.wait(120)
    finally:
        stop.set()
        writer.join(120)
    assert not problems, problems[0]
    for _, exc in failed:
        assert isinstance(exc.__cause__, redis.exceptions.ConnectionError)
    # Every acknowledged turn is there, whole and once, in order; of the failed ones, only the
    # one in flight when the server died may be (its reply was lost, not its write).
    stored = []
    history = store.history("s")
    for question, answer in zip(history[::2], history[1::2], strict=True):
        assert answer.content == "a" + (question.content or "")[1:]
        stored.append(int((question.content or "")[1:]))
    assert stored == sorted(set(stored))
    assert set(acked) <= set(stored)
    assert len(set(stored) - set(acked)) <= 1
    assert len(history) == 2 * len(stored)
    # The memory works again, without being rebuilt: the context is the newest turns.
    context = memory.get_context()
    assert [m.content for m in context] == [
        text for i in stored[-3:] for text in (f"q{i}", f"a{i}")
    ]
    store.close()


def test_the_scripts_are_loaded_again_after_a_restart(private_redis: RedisServer) -> None:
    """A restarted server has forgotten the scripts: NOSCRIPT, then they are loaded, and the
    command that met NOSCRIPT (which did nothing) runs again: alone, in a pipeline, or in a
    MULTI/EXEC beside the tail it is read with."""
    probe = redis.Redis.from_url(private_redis.url)

    def restart() -> None:
        private_redis.kill()
        private_redis.start()
        assert probe.script_exists(*SHAS.values()) == [False] * len(SHAS)

    async def main() -> None:
        store = AsyncRedisStore(private_redis.url, prefix="restart", ttl=60)
        await store.aappend("s", [Message(Role.USER, "before")])
        private_redis.kill()
        with pytest.raises(StoreUnavailableError):
            await store.aappend("s", [Message(Role.USER, "while down")])
        private_redis.start()
        assert await store.aappend("s", [Message(Role.USER, "after")]) == 1
        assert probe.script_exists(*SHAS.values()) == [True] * len(SHAS)
        assert [m.content for m in await store.ahistory("s")] == ["before", "after"]
        await asyncio.to_thread(restart)  # the loop runs meanwhile, as it would in an app
        stored, tail = await store.aappend_then_tail("s", [Message(Role.USER, "once")], None, 5)
        assert stored == 1
        assert [m.content for m in tail.messages] == ["before", "after", "once"]
        await asyncio.to_thread(restart)
        assert [i.session_id for i in await store.alist_sessions()] == ["s"]
        await store.aclose()

    try:
        asyncio.run(main())
        store = RedisStore(private_redis.url, prefix="restart", ttl=60)
        restart()
        stored, tail = store.append_then_tail("s", [Message(Role.USER, "sync")], None, 1)
        assert (stored, [m.content for m in tail.messages]) == (1, ["sync"])
        restart()
        assert store.compare_and_set("s", "zerda.k", None, 1)
        restart()
        assert store.purge_expired() == 0
        assert [m.content for m in store.history("s")] == ["before", "after", "once", "sync"]
        store.close()
    finally:
        probe.close()


def test_round_trips_in_the_servers_own_statistics(private_redis: RedisServer) -> None:
    """INFO commandstats on a server nobody else uses: every call is one EVALSHA or one
    MULTI/EXEC; every other command ran inside one of them."""
    probe = redis.Redis.from_url(private_redis.url)
    store = RedisStore(private_redis.url, prefix="stats", ttl=3600, max_messages=20)
    store.append("s", stamped(conversation(1)))  # the scripts loaded
    probe.config_resetstat()
    for t in range(50):
        turn = stamped(conversation(1)[1:])
        store.append("s", turn)  # EVALSHA
        store.append("s", turn)  # EVALSHA: a retry, stores nothing
        store.tail("s", 3)  # MULTI/EXEC
        store.append_then_tail("s", stamped(conversation(1)[1:]), None, 3)  # MULTI/EXEC
        store.compare_and_set("s", "zerda.n", t or None, t + 1)  # EVALSHA
    stats = probe.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): v["calls"] for name, v in stats.items()}
    assert (calls.pop("evalsha"), calls.pop("multi"), calls.pop("exec")) == (200, 100, 100)
    inside_a_tail = {"hgetall", "llen", "lrange"}
    inside_the_scripts = {"hmget", "hget", "llen", "rpush", "lindex", "lset", "ltrim", "hset"}
    inside_the_scripts |= {"pexpire", "zscore", "zadd", "zremrangebyscore"}
    ours = {"info", "config|resetstat"}
    assert calls.keys() <= inside_a_tail | inside_the_scripts | ours, calls
    assert calls["lrange"] == 200  # two per tail (system messages, turns), in MULTI
    assert calls["hgetall"] == 100  # the session's metadata, with each tail
    store.close()
    probe.close()


def test_a_tail_reads_what_it_returns_whatever_the_session_length(
    private_redis: RedisServer,
) -> None:
    """The bytes Redis sends for a tail are the same for a session of 60 and of 12,000
    messages ending alike (the server's own count, on a server nobody else uses)."""
    probe = redis.Redis.from_url(private_redis.url)
    store = RedisStore(private_redis.url, prefix="cost")
    end = conversation(8, tag="end")[1:]
    store.append("small", conversation(3)[:-1], {"x": [7] * 8})
    store.append("small", conversation(3)[-1:] + end, {"x": [7] * (1 + len(end))})
    big = conversation(3000)
    store.append("big", big[:-1], {"x": [7] * (len(big) - 1)})
    store.append("big", big[-1:] + end, {"x": [7] * (1 + len(end))})

    def sent(read: Callable[[], object]) -> int:
        before = probe.info("stats")["total_net_output_bytes"]
        read()
        return int(probe.info("stats")["total_net_output_bytes"]) - int(before)

    baseline = sent(lambda: None)  # the INFO reply itself
    for turns in (1, 5, 8):
        small = sent(functools.partial(store.tail, "small", turns, "x")) - baseline
        large = sent(functools.partial(store.tail, "big", turns, "x")) - baseline
        assert store.tail("big", turns).messages == store.tail("small", turns).messages
        # The replies differ in the digits of the session's counts, and INFO in its own.
        assert abs(large - small) < 64, (turns, small, large)
    # The measure does see work that grows with the session.
    assert sent(lambda: store.history("big")) > 100 * sent(lambda: store.history("small"))
    store.close()
    probe.close()


# -- the command line ----------------------------------------------------------------------------


def zerda(*args: str, db: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ZERDA_DB"}
    env.update({"XDG_DATA_HOME": str(cwd / "xdg"), "HOME": str(cwd), "COLUMNS": "200"})
    env["PYTHONIOENCODING"] = "utf-8"
    return subprocess.run(
        [sys.executable, "-m", "zerda.cli", *args, "--db", db],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
        check=False,
    )


def test_the_cli_against_redis(url: str, prefix: str, tmp_path: Path) -> None:
    db = f"{url}{'&' if '?' in url else '?'}prefix={prefix}"
    run = zerda("import", str(EXAMPLE), "--session", "demo", db=db, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    run = zerda("sessions", "--json", db=db, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    [info] = json.loads(run.stdout)
    assert info["session_id"] == "demo"
    assert info["messages"] == len(EXAMPLE.read_text().splitlines())
    run = zerda("export", "demo", db=db, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout == EXAMPLE.read_text()
    run = zerda("show", "demo", "--context", "--k", "1", "--json", db=db, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip()
    run = zerda("stats", "--json", db=db, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["backend"] == "redis"
    assert zerda("rm", "demo", db=db, cwd=tmp_path).returncode == 0
    run = zerda("sessions", "--json", db=db, cwd=tmp_path)
    assert (run.returncode, json.loads(run.stdout)) == (0, [])
    # The same sessions as a store sees them: the CLI wrote under the prefix, nowhere else.
    assert RedisStore(url, prefix=prefix).list_sessions() == []


def test_the_cli_says_in_one_line_when_redis_is_down(tmp_path: Path) -> None:
    port = free_port()
    run = zerda("sessions", db=f"redis://:hunter2@127.0.0.1:{port}/0", cwd=tmp_path)
    assert run.returncode != 0
    assert "Traceback" not in run.stderr
    assert len(run.stderr.splitlines()) == 1, run.stderr
    assert f"127.0.0.1:{port}" in run.stderr
    assert "hunter2" not in run.stderr

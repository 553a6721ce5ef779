"""RedisStore and AsyncRedisStore on a Redis Cluster: the whole store contract, and what only a
cluster shows (one slot per session, every primary visited)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("redis", reason="the redis extra is not installed")

import redis
import redis.asyncio.cluster
import redis.cluster
from redis.crc import key_slot

from _redis_servers import RedisCluster, drop_keys, free_port, fresh_prefix
from stores.contract import AsyncStoreContract, StoreContract
from zerda.errors import ConfigurationError, StoreUnavailableError
from zerda.messages import Message, Role
from zerda.stores import AsyncRedisStore, RedisStore, open_store
from zerda.stores._redis import open_redis_url

SUFFIXES = ("meta", "log", "system", "ids")


def seed(cluster: RedisCluster) -> str:
    """The seed node's URL as redis-py takes it."""
    return f"redis://127.0.0.1:{cluster.ports[0]}"


@pytest.fixture
def admin(redis_cluster: RedisCluster) -> Iterator[redis.cluster.RedisCluster]:
    """A plain cluster client, to look at the keys behind a store's back."""
    client = redis.cluster.RedisCluster.from_url(seed(redis_cluster))
    yield client
    client.close()


@pytest.fixture
def prefix(admin: redis.cluster.RedisCluster) -> Iterator[str]:
    name = fresh_prefix()
    yield name
    drop_keys(admin, name)


# -- the contract --------------------------------------------------------------------------------


class _ClusterContract:
    """A fresh key prefix for every store a test makes; the test's keys deleted at its end."""

    url: str
    base: str

    @pytest.fixture(autouse=True)
    def _cluster_env(self, redis_cluster: RedisCluster) -> Iterator[None]:
        self.url = redis_cluster.url
        self.base = fresh_prefix()
        self._made = itertools.count()
        yield
        drop_keys(redis_cluster.admin(), self.base)

    def next_prefix(self) -> str:
        return f"{self.base}.{next(self._made)}"

    def reopen_recipe(self, store: Any) -> tuple[str, dict[str, Any]]:
        # The redis+cluster:// URL says "cluster" by itself.
        return f"zerda.stores:{type(store).__name__}", {"url": self.url, "prefix": store.prefix}


class TestRedisStoreOnACluster(_ClusterContract, StoreContract):
    supports_processes = True

    def make_store(
        self, *, ttl: float | None, max_messages: int | None, clock: Callable[[], float]
    ) -> RedisStore:
        return RedisStore(
            self.url, prefix=self.next_prefix(), ttl=ttl, max_messages=max_messages, clock=clock
        )


class TestAsyncRedisStoreOnACluster(_ClusterContract, AsyncStoreContract):
    supports_processes = True

    def make_store(
        self, *, ttl: float | None, max_messages: int | None, clock: Callable[[], float]
    ) -> AsyncRedisStore:
        return AsyncRedisStore(
            self.url,
            prefix=self.next_prefix(),
            ttl=ttl,
            max_messages=max_messages,
            clock=clock,
            cluster=True,
        )


# -- what only a cluster shows -------------------------------------------------------------------


def owner(admin: redis.cluster.RedisCluster, key: str) -> str:
    """The name (host:port) of the primary that holds ``key``'s slot."""
    node = admin.nodes_manager.get_node_from_slot(key_slot(key.encode()))
    name: str = node.name
    return name


def spread_sessions(admin: redis.cluster.RedisCluster, prefix: str) -> dict[str, str]:
    """Session ids, one on each primary: session id -> the primary holding its keys."""
    primaries = {node.name for node in admin.get_primaries()}
    chosen: dict[str, str] = {}
    for n in itertools.count():
        session_id = f"user-{n}"
        node = owner(admin, f"{prefix}:{{{session_id}}}:meta")
        if node not in chosen.values():
            chosen[session_id] = node
        if set(chosen.values()) == primaries:
            return chosen
        assert n < 10_000
    raise AssertionError("unreachable")


def test_a_sessions_keys_share_one_slot_and_sessions_spread_over_every_primary(
    redis_cluster: RedisCluster, admin: redis.cluster.RedisCluster, prefix: str
) -> None:
    store = RedisStore(redis_cluster.url, prefix=prefix, ttl=600, max_messages=4)
    assert store.cluster
    sessions = spread_sessions(admin, prefix)
    assert len(set(sessions.values())) == 3, "the cluster has 3 primaries"
    for session_id in sessions:
        batch = [
            Message(Role.SYSTEM, "pinned"),
            Message(Role.USER, f"hi from {session_id}"),
            Message(Role.ASSISTANT, "hello"),
        ]
        store.append(session_id, [m.stamped() for m in batch])
        store.update_metadata(session_id, {"k": 1})
        assert store.compare_and_set(session_id, "zerda.summary", None, {"text": "s"})
    for session_id, node in sessions.items():
        keys = [f"{prefix}:{{{session_id}}}:{suffix}" for suffix in SUFFIXES]
        assert len({key_slot(key.encode()) for key in keys}) == 1, "one session, one slot"
        host, port = node.rsplit(":", 1)
        on_node = redis.Redis(host=host, port=int(port))
        try:
            # Every key is on the primary that owns the slot, and nowhere else.
            assert sorted(k.decode() for k in on_node.scan_iter(match=f"{prefix}*")) == sorted(keys)
        finally:
            on_node.close()
    store.close()


def test_list_clear_and_purge_visit_every_primary(
    redis_cluster: RedisCluster, admin: redis.cluster.RedisCluster, prefix: str
) -> None:
    now = [1_000.0]
    store = RedisStore(redis_cluster.url, prefix=prefix, ttl=10, clock=lambda: now[0])
    sessions = sorted(spread_sessions(admin, prefix))
    for session_id in sessions:
        store.append(session_id, [Message(Role.USER, "hi")])
    assert [i.session_id for i in store.list_sessions()] == sessions
    now[0] += 5
    store.append(sessions[0], [Message(Role.USER, "again")])  # keeps one alive
    now[0] += 5
    assert store.purge_expired() == len(sessions) - 1
    assert [i.session_id for i in store.list_sessions()] == sessions[:1]
    for session_id in sessions:
        store.append(session_id, [Message(Role.USER, "more")])
    assert len(store.list_sessions()) == len(sessions)
    store.clear()
    assert store.list_sessions() == []
    assert list(admin.scan_iter(match=f"{prefix}*")) == []
    store.close()


def test_the_async_store_on_a_cluster_sees_the_sync_stores_sessions(
    redis_cluster: RedisCluster, admin: redis.cluster.RedisCluster, prefix: str
) -> None:
    sync = RedisStore(redis_cluster.url, prefix=prefix)
    sessions = sorted(spread_sessions(admin, prefix))
    for session_id in sessions:
        sync.append(session_id, [Message(Role.USER, session_id, id=f"id-{session_id}")])

    async def main() -> None:
        async with AsyncRedisStore(redis_cluster.url, prefix=prefix) as store:
            assert [i.session_id for i in await store.alist_sessions()] == sessions
            for session_id in sessions:
                again = Message(Role.USER, session_id, id=f"id-{session_id}")
                assert await store.aappend(session_id, [again]) == 0
                stored, tail = await store.aappend_then_tail(
                    session_id, [Message(Role.ASSISTANT, "ok")], None, 1
                )
                assert stored == 1
                assert [m.content for m in tail.messages] == [session_id, "ok"]
            await store.aclear()
            assert await store.alist_sessions() == []

    asyncio.run(main())
    sync.close()


# -- opening a cluster ---------------------------------------------------------------------------


def test_open_store_and_open_redis_url_take_redis_cluster_urls(
    redis_cluster: RedisCluster, prefix: str
) -> None:
    url = f"{redis_cluster.url}/0?prefix={prefix}"
    store = open_redis_url(url, ttl=60)
    assert (store.cluster, store.prefix, store.ttl) == (True, prefix, 60)
    store.append("s", [Message(Role.USER, "via the cluster")])
    other = RedisStore(seed(redis_cluster), cluster=True, prefix=prefix)
    assert [m.content for m in other.history("s")] == ["via the cluster"]
    assert store.url == f"{redis_cluster.url}/0"
    store.close()
    other.close()
    via_open_store = open_store(url)
    assert isinstance(via_open_store, RedisStore)
    assert via_open_store.cluster
    via_open_store.close()


def test_a_cluster_client_given_means_cluster_mode(
    redis_cluster: RedisCluster, admin: redis.cluster.RedisCluster, prefix: str
) -> None:
    store = RedisStore(client=admin, prefix=prefix)
    assert store.cluster
    assert store.url == f"redis+cluster://127.0.0.1:{redis_cluster.ports[0]}"
    store.append("s", [Message(Role.USER, "hi")])
    assert store.client is admin
    store.close()
    assert admin.ping(), "a client given is never closed by the store"

    async def main() -> None:
        client = redis.asyncio.cluster.RedisCluster.from_url(seed(redis_cluster))
        async_store = AsyncRedisStore(client=client, prefix=prefix)
        assert async_store.cluster
        assert [m.content for m in await async_store.ahistory("s")] == ["hi"]
        await async_store.aclose()
        await client.aclose()

    asyncio.run(main())


def test_cluster_mode_needs_a_cluster_client(redis_cluster: RedisCluster) -> None:
    client = redis.Redis.from_url(seed(redis_cluster))
    with pytest.raises(ConfigurationError, match="cluster"):
        RedisStore(client=client, cluster=True)
    client.close()


@pytest.mark.parametrize(
    ("url", "cluster"),
    [
        ("redis+cluster://127.0.0.1:7000/3", False),
        ("redis+cluster://127.0.0.1:7000?db=2", False),
        ("redis+cluster://127.0.0.1:99999", False),
        ("redis+cluster://127.0.0.1:7000/x", False),
        ("redis+cluster://127.0.0.1:7000?no_such_option=1", False),
        ("redis://127.0.0.1:7000/1", True),
        ("unix:///tmp/redis.sock", True),
    ],
)
def test_a_bad_cluster_url_is_a_configuration_error(url: str, cluster: bool) -> None:
    """Refused when the store is made, never at first use (the sync client is made then)."""
    for store_class in (RedisStore, AsyncRedisStore):
        with pytest.raises(ConfigurationError):
            store_class(url, cluster=cluster)


def test_making_a_cluster_store_waits_on_nothing_and_a_dead_cluster_is_unavailable() -> None:
    port = free_port()
    started = time.monotonic()
    store = RedisStore(f"redis+cluster://:hunter2@127.0.0.1:{port}", timeout=1)
    assert "hunter2" not in repr(store)
    with pytest.raises(StoreUnavailableError) as info:
        store.append("s", [Message(Role.USER, "hi")])
    assert time.monotonic() - started < 1 + 1
    assert f"127.0.0.1:{port}" in str(info.value)
    assert "hunter2" not in str(info.value)
    with pytest.raises(StoreUnavailableError):
        _ = store.client
    store.close()

    async def main() -> None:
        async with AsyncRedisStore(f"redis+cluster://:hunter2@127.0.0.1:{port}") as store:
            with pytest.raises(StoreUnavailableError) as info:
                await store.atail("s", 1)
            assert "hunter2" not in str(info.value)

    asyncio.run(main())


@pytest.mark.parametrize("decode", [False, True])
def test_a_resp2_cluster_client_reads_the_same(
    redis_cluster: RedisCluster, prefix: str, decode: bool
) -> None:
    """In a cluster's MULTI/EXEC redis-py gives RESP2 replies bare (a hash as a flat list)."""
    client = redis.cluster.RedisCluster.from_url(
        seed(redis_cluster), protocol=2, decode_responses=decode
    )
    store = RedisStore(client=client, prefix=prefix)
    turn = [Message(Role.SYSTEM, "pinned", id="p"), Message(Role.USER, "q", id="q")]
    store.update_metadata("s", {"k": [1, {"a": None}]})
    stored, tail = store.append_then_tail("s", turn, {"x": [1, 2]}, 1, "x")
    assert stored == 2
    assert (list(tail.system), list(tail.messages), list(tail.tokens)) == (turn[:1], turn[1:], [2])
    assert dict(tail.metadata) == {"k": [1, {"a": None}]}
    assert store.compare_and_set("s", "zerda.s", None, {"t": 1.0})
    assert store.compare_and_set("s", "zerda.s", {"t": 1}, 2)
    assert dict(store.tail("s", None).metadata) == store.get_metadata("s")
    assert store.get_metadata("s") == {"k": [1, {"a": None}], "zerda.s": 2}
    assert store.append("s", turn) == 0
    assert [i.session_id for i in store.list_sessions()] == ["s"]
    store.close()
    client.close()

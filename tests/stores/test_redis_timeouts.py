"""Bounded waits: a Redis that stops answering costs a call at most ``timeout`` + 1 s, and an
append whose outcome was unknown, retried with the same messages, is stored once."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

pytest.importorskip("redis", reason="the redis extra is not installed")

import redis

from _freeze import FreezableProxy
from _redis_servers import RedisServer, drop_keys, fresh_prefix
from services import require_redis
from zerda.errors import StoreUnavailableError
from zerda.messages import Message, Role
from zerda.stores import AsyncRedisStore, RedisStore

TIMEOUT = 1.0
BOUND = TIMEOUT + 1  # what the issue allows a call against a frozen server
WATCHDOG = TIMEOUT + 20  # past this, the test gives up on a call: it would wait for ever


def bounded(call: Callable[[], object]) -> float:
    """Run ``call``, which must raise StoreUnavailableError; the seconds it took (measured
    around the call). A call still waiting after WATCHDOG seconds fails the test."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        started = time.monotonic()
        try:
            call()
        except BaseException as exc:
            outcome["error"] = exc
        outcome["took"] = time.monotonic() - started

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(WATCHDOG)
    if worker.is_alive():
        pytest.fail(f"the call was still waiting after {WATCHDOG} s: no bound at all")
    error = outcome.get("error")
    assert isinstance(error, StoreUnavailableError), f"got {error!r}, not StoreUnavailableError"
    took: float = outcome["took"]
    return took


async def abounded(call: Coroutine[Any, Any, object]) -> float:
    """:func:`bounded` for a coroutine."""
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError):
        await asyncio.wait_for(call, WATCHDOG)
    return time.monotonic() - started


def wait_until(done: Callable[[], bool], what: str) -> None:
    """Poll until ``done()``: for what a frozen server applies once it wakes, which nothing
    tells the test about (the client that sent it gave up)."""
    deadline = time.monotonic() + 30
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        time.sleep(0.01)


def batch() -> list[Message]:
    """A turn as a memory stores it: each message with its id."""
    return [m.stamped() for m in (Message(Role.USER, "q"), Message(Role.ASSISTANT, "a"))]


@pytest.fixture
def server() -> Iterator[tuple[redis.Redis, str, int]]:
    """A client of the test Redis (never through the proxy), its host and port."""
    options = redis.connection.parse_url(require_redis())
    if "path" in options:
        pytest.skip("the test Redis is a unix socket: the proxy forwards TCP")
    client = redis.Redis(**options)
    yield client, options.get("host", "localhost"), options.get("port", 6379)
    client.close()


@pytest.fixture
def proxy(server: tuple[redis.Redis, str, int]) -> Iterator[FreezableProxy]:
    _, host, port = server
    with FreezableProxy(host, port) as frozen:
        yield frozen


@pytest.fixture
def prefix(server: tuple[redis.Redis, str, int]) -> Iterator[str]:
    name = fresh_prefix()
    yield name
    drop_keys(server[0], name)


# -- a server that stops answering after the connection was made (a proxy, frozen) -----------


def test_a_frozen_server_costs_a_call_its_timeout_and_a_retried_append_is_stored_once(
    server: tuple[redis.Redis, str, int], proxy: FreezableProxy, prefix: str
) -> None:
    store = RedisStore(f"redis://127.0.0.1:{proxy.port}/0", prefix=prefix, timeout=TIMEOUT)
    direct = RedisStore(client=server[0], prefix=prefix)  # sees the server itself
    first, turn = batch(), batch()
    store.append("s", first)  # connected, the scripts loaded
    assert store.compare_and_set("s", "zerda.n", None, 1)
    proxy.freeze()
    calls: list[Callable[[], object]] = [
        lambda: store.append("s", turn),  # sent; its outcome unknown to the caller
        lambda: store.tail("s", 1),
        lambda: store.compare_and_set("s", "zerda.n", 1, 2),
        lambda: store.append_then_tail("s", turn, None, 1),
        lambda: store.get_metadata("s"),
        lambda: store.update_metadata("s", {"k": 1}),
        lambda: store.history("s"),
        store.list_sessions,
    ]
    for i, call in enumerate(calls):
        took = bounded(call)
        assert took < BOUND, f"call {i} took {took:.2f} s against a frozen server"
    proxy.thaw()
    # The frozen server gets the append once it wakes: the write happened, the caller saw an
    # error. Its retry, with the same messages (the same ids), stores nothing.
    wait_until(lambda: len(direct.history("s")) == 4, "the append sent while frozen is applied")
    assert store.append("s", turn) == 0
    stored, tail = store.append_then_tail("s", turn, None, 1)
    assert (stored, list(tail.messages)) == (0, turn)
    assert store.history("s") == [*first, *turn], "stored once"
    # The store works again, without being rebuilt.
    assert store.compare_and_set("s", "zerda.n", 1, 2)
    assert store.get_metadata("s") == {"zerda.n": 2}
    store.close()


def test_a_frozen_server_costs_an_async_call_its_timeout(
    server: tuple[redis.Redis, str, int], proxy: FreezableProxy, prefix: str
) -> None:
    direct = RedisStore(client=server[0], prefix=prefix)
    first, turn = batch(), batch()

    async def main() -> None:
        store = AsyncRedisStore(f"redis://127.0.0.1:{proxy.port}/0", prefix=prefix, timeout=TIMEOUT)
        await store.aappend("s", first)
        assert await store.acompare_and_set("s", "zerda.n", None, 1)
        proxy.freeze()
        calls = [
            store.aappend("s", turn),
            store.atail("s", 1),
            store.acompare_and_set("s", "zerda.n", 1, 2),
            store.aappend_then_tail("s", turn, None, 1),
            store.aget_metadata("s"),
            store.alist_sessions(),
        ]
        for i, call in enumerate(calls):
            took = await abounded(call)
            assert took < BOUND, f"call {i} took {took:.2f} s against a frozen server"
        proxy.thaw()
        await asyncio.to_thread(
            wait_until, lambda: len(direct.history("s")) == 4, "the frozen append is applied"
        )
        assert await store.aappend("s", turn) == 0
        assert await store.ahistory("s") == [*first, *turn], "stored once"
        assert await store.acompare_and_set("s", "zerda.n", 1, 2)
        await store.aclose()

    asyncio.run(main())


# -- a server stopped with SIGSTOP ---------------------------------------------------------------


def test_a_stopped_server_costs_a_call_its_timeout_and_works_again_once_continued(
    start_redis: Callable[..., RedisServer],
) -> None:
    server = start_redis()
    store = RedisStore(server.url, prefix="stopped", timeout=TIMEOUT)
    first, turn = batch(), batch()
    store.append("s", first)
    assert store.compare_and_set("s", "zerda.n", None, 1)
    server.stop()
    try:
        calls: list[Callable[[], object]] = [
            lambda: store.append("s", turn),
            lambda: store.tail("s", 1),
            lambda: store.compare_and_set("s", "zerda.n", 1, 2),
            lambda: store.append_then_tail("s", turn, None, 1),
            lambda: store.get_metadata("s"),
        ]
        for i, call in enumerate(calls):
            took = bounded(call)
            assert took < BOUND, f"call {i} took {took:.2f} s against a stopped server"
    finally:
        server.cont()
    # Whatever the stopped server did with the append it was sent, a retry stores it once.
    store.append("s", turn)
    assert store.history("s") == [*first, *turn]
    assert store.compare_and_set("s", "zerda.n", 1, 2)

    async def main() -> None:
        async with AsyncRedisStore(server.url, prefix="stopped", timeout=TIMEOUT) as astore:
            await astore.atail("s", 1)
            server.stop()
            try:
                took = await abounded(astore.aappend("s", turn))
            finally:
                server.cont()
            assert took < BOUND
            assert await astore.aappend("s", turn) == 0
            assert await astore.ahistory("s") == [*first, *turn]

    asyncio.run(main())
    store.close()

"""Bounded waits on Postgres: every call returns or raises StoreUnavailableError within the
store's timeout (+1 s), however the server stops answering, and works again once it is back.

Two ways a server stops answering after the connection was made: a loopback proxy that freezes
(``tests/_freeze.py``: it holds everything back, and delivers it when it thaws, as a frozen
server would act on it when it wakes), and SIGSTOP on a private server (``_postgres_servers``).
The only sleeps here are the waits inside those scenarios; the one timed assertion is the bound.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg_pool import ConnectionPool

import services
from _freeze import FreezableProxy
from _postgres_servers import Cluster, private_cluster
from zerda.errors import StoreUnavailableError
from zerda.messages import Message, Role
from zerda.stores import AsyncPostgresStore, PostgresStore

TIMEOUT = 1.0
BOUND = TIMEOUT + 1.0  # the definition of done: at most timeout + 1 s per call
_schemas = itertools.count()


def user(text: str) -> Message:
    return Message(Role.USER, text).stamped()


def assistant(text: str) -> Message:
    return Message(Role.ASSISTANT, text).stamped()


@pytest.fixture
def dsn() -> str:
    return services.require_postgres()


@pytest.fixture
def schema(dsn: str) -> Iterator[str]:
    name = f"{services.RUN_ID}_t{next(_schemas)}"
    yield name
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def proxy(dsn: str) -> Iterator[FreezableProxy]:
    parts = urlsplit(dsn)
    if parts.scheme not in ("postgresql", "postgres") or not parts.hostname:
        pytest.skip("the freezing proxy needs a postgresql://host:port URL as test DSN")
    with FreezableProxy(parts.hostname, parts.port or 5432) as p:
        yield p


def through(dsn: str, port: int) -> str:
    """``dsn`` (a URL) pointing at 127.0.0.1:``port`` instead."""
    parts = urlsplit(dsn)
    user = parts.netloc.rpartition("@")[0]
    netloc = f"{user}@127.0.0.1:{port}" if user else f"127.0.0.1:{port}"
    return parts._replace(netloc=netloc).geturl()


def bounded(call: Callable[[], object]) -> StoreUnavailableError:
    """Run ``call``: it must raise StoreUnavailableError within the bound. (In a thread, so
    that a call that blocks for ever fails the test instead of hanging it.)"""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(BOUND + 5)
    elapsed = time.monotonic() - started
    assert outcome, f"the call was still blocked after {elapsed:.1f} s"
    error = outcome[0]
    assert isinstance(error, StoreUnavailableError), f"expected StoreUnavailableError: {error!r}"
    assert elapsed <= BOUND, f"the call took {elapsed:.2f} s: {error}"
    return error


async def abounded(call: Callable[[], Awaitable[object]]) -> StoreUnavailableError:
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError) as info:
        await asyncio.wait_for(call(), BOUND + 5)
    elapsed = time.monotonic() - started
    assert elapsed <= BOUND, f"the call took {elapsed:.2f} s: {info.value}"
    return info.value


def stored_ids(dsn: str, schema: str, session_id: str) -> list[str | None]:
    """The ids of a session's rows, read behind the store's back (not through the proxy)."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        rows = conn.execute(
            f'SELECT m.id FROM "{schema}".messages m JOIN "{schema}".sessions s USING (sid) '
            "WHERE s.session_id = %s ORDER BY m.seq",
            [session_id],
        ).fetchall()
    return [message_id for (message_id,) in rows]


def wait_until(condition: Callable[[], bool], what: str, seconds: float = 15) -> None:
    """Poll ``condition`` (the proxy thawing, a server waking up: nothing to be told by)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not after {seconds} s"
        time.sleep(0.05)


# -- a frozen server: the proxy holds everything back --------------------------------------------


def frozen_calls(s: Any, prefix: str = "") -> dict[str, Callable[[], Any]]:
    """One call of each kind that goes to the server, for a store (or its ``a``-twins)."""

    def call(name: str, *args: Any) -> Callable[[], Any]:
        return lambda: getattr(s, prefix + name)(*args)

    return {
        "append": call("append", "s", [user("frozen 1")]),
        "tail": call("tail", "s", 3),
        "compare_and_set": call("compare_and_set", "s", "zerda.k", None, 1),
        "append_then_tail": call("append_then_tail", "s", [user("frozen 2")], None, 2),
        "get_metadata": call("get_metadata", "s"),
    }


def test_a_frozen_server_costs_each_call_at_most_the_timeout(
    dsn: str, schema: str, proxy: FreezableProxy
) -> None:
    calls = 5
    with PostgresStore(
        through(dsn, proxy.port), schema=schema, timeout=TIMEOUT, min_size=calls, max_size=calls
    ) as store:
        store.append("s", [user("before")])
        store._pool.wait(10)  # every connection made, so that each call below gets one
        proxy.freeze()
        try:
            for name, call in frozen_calls(store).items():
                error = bounded(call)
                # Sent on a live connection, cut at the deadline: the client's watchdog.
                assert "no answer within" in str(error), (name, error)
                assert isinstance(error.__cause__, TimeoutError)
            # No connection left: the wait for one is bounded too.
            error = bounded(lambda: store.history("s"))
            assert "no connection within" in str(error)
        finally:
            proxy.thaw()
        # (What was sent while frozen reaches the server at the thaw, and may be applied.)
        after = user("after")
        assert store.append("s", [after]) == 1
        assert after in store.history("s")
        assert store.compare_and_set("s", "other", None, 2) is True


def test_async_a_frozen_server_costs_each_call_at_most_the_timeout(
    dsn: str, schema: str, proxy: FreezableProxy
) -> None:
    calls = 5

    async def main() -> None:
        async with AsyncPostgresStore(
            through(dsn, proxy.port),
            schema=schema,
            timeout=TIMEOUT,
            min_size=calls,
            max_size=calls,
        ) as store:
            await store.aappend("s", [user("before")])
            await store._pool.wait(10)
            proxy.freeze()
            try:
                for name, call in frozen_calls(store, "a").items():
                    error = await abounded(call)
                    assert "no answer within" in str(error), (name, error)
                error = await abounded(lambda: store.ahistory("s"))
                assert "no connection within" in str(error)
            finally:
                proxy.thaw()
            after = user("after")
            assert await store.aappend("s", [after]) == 1
            assert after in await store.ahistory("s")
            assert await store.acompare_and_set("s", "other", None, 2) is True

    asyncio.run(main())


def test_a_schema_check_on_a_frozen_server_is_bounded_too(
    dsn: str, schema: str, proxy: FreezableProxy
) -> None:
    """The first call reads the schema version first; a pool of one's own, made before the
    freeze, gives it a connection (and gets the same client-side deadline)."""
    pool = ConnectionPool(through(dsn, proxy.port), min_size=1, max_size=1, open=True)
    try:
        pool.wait(10)
        with PostgresStore(pool=pool, schema=schema, timeout=TIMEOUT) as store:
            proxy.freeze()
            try:
                error = bounded(lambda: store.tail("s", 1))
            finally:
                proxy.thaw()
            assert "read the schema version" in str(error)
            assert store.append("s", [user("made")]) == 1
    finally:
        pool.close()


@contextmanager
def frozen_append_then_thawed(
    proxy: FreezableProxy, dsn: str, schema: str, batch: list[Message]
) -> Iterator[None]:
    """Freeze, let the block's append fail, thaw; then wait until the append held back by the
    proxy has reached the server and been applied (read directly, not through the proxy)."""
    proxy.freeze()
    try:
        yield
    finally:
        proxy.thaw()
    wanted = [m.id for m in batch]
    wait_until(
        lambda: stored_ids(dsn, schema, "s")[-len(wanted) :] == wanted,
        "the append sent while frozen was applied at the thaw",
    )


def test_an_append_that_timed_out_and_was_applied_later_is_stored_once_when_retried(
    dsn: str, schema: str, proxy: FreezableProxy
) -> None:
    with PostgresStore(through(dsn, proxy.port), schema=schema, timeout=TIMEOUT) as store:
        before = user("before")
        store.append("s", [before])
        batch = [user("question"), assistant("answer")]
        with frozen_append_then_thawed(proxy, dsn, schema, batch):
            bounded(lambda: store.append("s", batch))
        # The outcome was unknown to the caller, who retries with the same messages.
        assert store.append("s", batch) == 0
        assert store.history("s") == [before, *batch]
        assert store.tail("s", None).total_turns == 2


def test_async_an_append_that_timed_out_and_was_applied_later_is_stored_once_when_retried(
    dsn: str, schema: str, proxy: FreezableProxy
) -> None:
    async def main() -> None:
        async with AsyncPostgresStore(
            through(dsn, proxy.port), schema=schema, timeout=TIMEOUT
        ) as store:
            before = user("before")
            await store.aappend("s", [before])
            batch = [user("question"), assistant("answer")]
            proxy.freeze()
            try:
                await abounded(lambda: store.aappend("s", batch))
            finally:
                proxy.thaw()
            wanted = [m.id for m in batch]
            await asyncio.to_thread(
                wait_until,
                lambda: stored_ids(dsn, schema, "s")[-2:] == wanted,
                "the append sent while frozen was applied at the thaw",
            )
            stored, tail = await store.aappend_then_tail("s", batch, None, None)
            assert stored == 0
            assert list(tail.messages) == [before, *batch]

    asyncio.run(main())


# -- a live server, a slow statement: the server cancels it --------------------------------------


def test_a_statement_waiting_on_a_lock_is_cancelled_by_the_server(dsn: str, schema: str) -> None:
    with PostgresStore(dsn, schema=schema, timeout=TIMEOUT) as store:
        store.append("s", [user("before")])
        with psycopg.connect(dsn, connect_timeout=5) as holder:
            holder.execute(
                f'SELECT 1 FROM "{schema}".sessions WHERE session_id = %s FOR UPDATE', ["s"]
            )
            error = bounded(lambda: store.append("s", [user("blocked")]))
            holder.rollback()
        assert "statement timeout" in str(error)
        assert isinstance(error.__cause__, psycopg.errors.QueryCanceled)
        # The connection was kept (the server answered), and the store goes on.
        assert store._pool.get_stats().get("returns_bad", 0) == 0
        assert [m.content for m in store.history("s")] == ["before"]


# -- SIGSTOP on a private server ----------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with private_cluster() as c:
        yield c


def backends_of(cluster: Cluster, application: str) -> list[int]:
    """The server processes serving the connections named ``application``."""
    with psycopg.connect(cluster.dsn, autocommit=True, connect_timeout=5) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", [application]
        ).fetchall()
    return [pid for (pid,) in rows]


@pytest.mark.parametrize("what", ["backend", "server"])
def test_a_stopped_server_costs_each_call_at_most_the_timeout(cluster: Cluster, what: str) -> None:
    name = f"zerda-stop-{what}"
    dsn = f"{cluster.dsn}?application_name={name}"
    schema = f"{services.RUN_ID}_stop_{what}"
    with PostgresStore(dsn, schema=schema, timeout=TIMEOUT, min_size=1, max_size=1) as store:
        store.append("s", [user("before")])
        pids = backends_of(cluster, name)
        assert len(pids) == 1, pids
        with cluster.stopped(pids if what == "backend" else cluster.all_pids()):
            error = bounded(lambda: store.append("s", [user("while stopped")]))
            assert "no answer within" in str(error)
            if what == "server":  # no new connection either
                bounded(lambda: store.compare_and_set("s", "zerda.k", None, 1))
        # The stopped backend may still apply what it was sent when it wakes up.
        after = user("after")
        assert store.append("s", [after]) == 1
        assert after in store.history("s")


def test_async_a_stopped_backend_costs_each_call_at_most_the_timeout(cluster: Cluster) -> None:
    name = "zerda-stop-async"
    dsn = f"{cluster.dsn}?application_name={name}"
    schema = f"{services.RUN_ID}_stop_async"

    async def main() -> None:
        async with AsyncPostgresStore(
            dsn, schema=schema, timeout=TIMEOUT, min_size=1, max_size=1
        ) as store:
            await store.aappend("s", [user("before")])
            pids = await asyncio.to_thread(backends_of, cluster, name)
            assert len(pids) == 1, pids
            with cluster.stopped(pids):
                error = await abounded(lambda: store.atail("s", 1))
                assert "no answer within" in str(error)
            after = user("after")
            assert await store.aappend("s", [after]) == 1
            assert after in await store.ahistory("s")

    asyncio.run(main())

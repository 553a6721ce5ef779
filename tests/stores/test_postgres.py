"""PostgresStore and AsyncPostgresStore: the store contract, and what only Postgres has to show.

Every test works in schemas of its own (``services.RUN_ID`` plus a counter), dropped when it
ends, so runs never see each other's data. The fault tests start a private cluster (initdb,
pg_ctl; ``tests/_postgres_servers.py``) and stop it hard; the machine's server is never stopped.
Bounded waits (a frozen server, SIGSTOP) are in ``test_postgres_timeouts.py``.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import os
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

# The benchmarks' round-trip proxy: the same counter the benchmark reports with.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import psycopg
import pytest
from _proxy import RoundTripProxy
from psycopg_pool import AsyncConnectionPool, ConnectionPool

import services
import zerda.stores._postgres as postgres_module
from _conversations import conversation
from _postgres_servers import Cluster, free_port, private_cluster
from _processes import run_processes
from stores.contract import (
    T0,
    AsyncStoreContract,
    FakeClock,
    StoreContract,
    canonical,
    check_batches,
    native_async_reading_what_sync_wrote,
    process_writer,
    tagged_batch,
    tagged_tokens,
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
    AsyncPostgresStore,
    AsyncStore,
    PostgresStore,
    Store,
    open_store,
)
from zerda.stores._base import redact, same_json
from zerda.stores._postgres import MIGRATIONS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "coffee-order.jsonl"
_schemas = itertools.count()


# -- schemas of our own ----------------------------------------------------------------------


def fresh_schema(tag: str = "s") -> str:
    """A schema name no other test (or run) uses."""
    return f"{services.RUN_ID}_{tag}{next(_schemas)}"


@contextmanager
def raw(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A plain autocommit connection, to look at or change the tables behind a store's back."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        yield conn


def drop_schemas(dsn: str, names: list[str]) -> None:
    with raw(dsn) as conn:
        for name in names:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def schema_exists(dsn: str, name: str) -> bool:
    with raw(dsn) as conn:
        row = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", [name]).fetchone()
    return row is not None


@pytest.fixture(scope="module", autouse=True)
def _drop_this_runs_schemas() -> Iterator[None]:
    """Whatever a failed test left behind, this run's schemas go when the module ends."""
    yield
    if services.postgres_problem() is not None:
        return
    with raw(services.POSTGRES_DSN) as conn:
        rows = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)",
            [f"{services.RUN_ID}_"],
        ).fetchall()
    drop_schemas(services.POSTGRES_DSN, [name for (name,) in rows])


@pytest.fixture
def dsn() -> str:
    return services.require_postgres()


@pytest.fixture
def schema(dsn: str) -> Iterator[str]:
    """A fresh schema name for the test, dropped when it ends (if it was created)."""
    name = fresh_schema()
    yield name
    drop_schemas(dsn, [name])


@pytest.fixture
def store(dsn: str, schema: str) -> Iterator[PostgresStore]:
    s = PostgresStore(dsn, schema=schema)
    yield s
    s.close()


# -- the contract ----------------------------------------------------------------------------


class _PostgresContract:
    """What both contract classes share: a schema per store, dropped after the test."""

    supports_processes = True
    store_class: Any

    @pytest.fixture(autouse=True)
    def _postgres_env(self) -> Iterator[None]:
        self.dsn = services.require_postgres()
        self.schemas: list[str] = []
        yield
        drop_schemas(self.dsn, self.schemas)

    def make_store(
        self, *, ttl: float | None, max_messages: int | None, clock: Callable[[], float]
    ) -> Any:
        name = fresh_schema("c")
        self.schemas.append(name)
        return self.store_class(
            self.dsn, schema=name, ttl=ttl, max_messages=max_messages, clock=clock
        )

    def reopen_recipe(self, store: Any) -> tuple[str, dict[str, Any]]:
        # The test DSN, not store.dsn: that one hides the password.
        return f"zerda.stores:{type(store).__name__}", {"dsn": self.dsn, "schema": store.schema}


class TestPostgresStore(_PostgresContract, StoreContract):
    store_class = PostgresStore


class TestAsyncPostgresStore(_PostgresContract, AsyncStoreContract):
    store_class = AsyncPostgresStore


# -- helpers ---------------------------------------------------------------------------------


def with_port(dsn: str, host: str, port: int) -> str:
    """``dsn`` (a URL) pointing at ``host:port`` instead."""
    parts = urlsplit(dsn)
    user = parts.netloc.rpartition("@")[0]
    netloc = f"{user}@{host}:{port}" if user else f"{host}:{port}"
    return parts._replace(netloc=netloc).geturl()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# -- options and construction ------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad", ["", "1abc", "a-b", "a b", 'a"; DROP TABLE x; --', "x" * 64, "pg_catalog", "é", 3]
)
def test_schema_names_are_identifiers(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="schema"):
        PostgresStore("postgresql://u@h/db", schema=bad)
    with pytest.raises(ConfigurationError, match="schema"):
        AsyncPostgresStore("postgresql://u@h/db", schema=bad)


def test_options_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="exactly one"):
        PostgresStore()
    pool = ConnectionPool("postgresql://u@h/db", open=False)
    with pytest.raises(ConfigurationError, match="exactly one"):
        PostgresStore("postgresql://u@h/db", pool=pool)
    with pytest.raises(ConfigurationError, match="ConnectionPool"):
        AsyncPostgresStore(pool=pool)  # type: ignore[arg-type]
    for dsn in ("", "   ", "not a connection string", 5):
        with pytest.raises(ConfigurationError, match="dsn"):
            PostgresStore(dsn)  # type: ignore[arg-type]
    for options in (
        {"min_size": -1},
        {"max_size": 0},
        {"min_size": 5, "max_size": 2},
        {"timeout": 0},
        {"timeout": "5"},
        {"ttl": 0},
        {"max_messages": 0},
    ):
        with pytest.raises(ConfigurationError):
            PostgresStore("postgresql://u@h/db", **options)


def test_constructing_a_store_does_no_io(dsn: str, schema: str) -> None:
    # A dead address: a store is a cheap view until its first call.
    store = PostgresStore("postgresql://u@127.0.0.1:1/db", schema=schema)
    assert repr(store) == f"PostgresStore('postgresql://u@127.0.0.1:1/db', schema={schema!r})"
    store.close()
    async_store = AsyncPostgresStore(dsn, schema=schema)
    run(async_store.aclose())
    assert not schema_exists(dsn, schema)


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("postgresql://ada:sekret@db:5432/chats", "postgresql://ada:***@db:5432/chats"),
        (
            "postgresql://ada@db/chats?password=sekret&sslmode=require",
            "postgresql://ada@db/chats?password=***&sslmode=require",
        ),
        (
            "host=db user=ada password=sekret dbname=chats",
            "host=db user=ada password=*** dbname=chats",
        ),
        ("host=db password = 'it s\\'ecret' dbname=x", "host=db password = *** dbname=x"),
        ("postgresql://db/chats", "postgresql://db/chats"),
    ],
)
def test_dsns_are_shown_without_password(dsn: str, shown: str) -> None:
    assert redact(dsn) == shown
    store = PostgresStore(dsn)
    assert store.dsn == shown
    assert repr(store) == f"PostgresStore({shown!r}, schema='zerda')"
    store.close()


SECRET = "Pw-s3cret"


def everything_said(exc: BaseException) -> str:
    """What a traceback of ``exc`` prints: its message and every chained exception's."""
    return "".join(traceback.format_exception(exc))


def dead_dsns(port: int) -> list[str]:
    """One DSN of each form, with a password, for a server that does not answer."""
    return [
        f"postgresql://u:{SECRET}@127.0.0.1:{port}/db",
        f"postgresql://u@127.0.0.1:{port}/db?password={SECRET}",
        f"postgresql://u@127.0.0.1:{port}/db?sslmode=disable&password={SECRET}&connect_timeout=3",
        f"host=127.0.0.1 port={port} user=u password={SECRET} dbname=d",
        f"host=127.0.0.1 port={port} user=u password='{SECRET}' dbname=d",
        f"host=127.0.0.1 port={port} user=u password = 'it\\'s {SECRET}' dbname=d",
    ]


def test_no_password_in_any_output_for_a_server_that_does_not_answer() -> None:
    # A refused connection fails at once; the timeout only leaves a busy machine (two test
    # workers) the time to make that attempt, so that its error is there to be chained.
    for dsn in dead_dsns(free_port()):
        with PostgresStore(dsn, timeout=5) as store:
            assert SECRET not in repr(store) + store.dsn, dsn
            assert "***" in store.dsn
            for call in (store.list_sessions, functools.partial(store.history, "s")):
                with pytest.raises(StoreUnavailableError) as info:
                    call()
                assert SECRET not in everything_said(info.value), dsn
                assert isinstance(info.value.__cause__, psycopg.OperationalError)

        async def main(dsn: str = dsn) -> None:
            async with AsyncPostgresStore(dsn, timeout=5) as astore:
                assert SECRET not in repr(astore) + astore.dsn
                with pytest.raises(StoreUnavailableError) as ainfo:
                    await astore.acompare_and_set("s", "k", None, 1)
                assert SECRET not in everything_said(ainfo.value), dsn

        run(main())


@pytest.mark.parametrize("key", ["PASSWORD", "Password"])
def test_a_password_key_libpq_does_not_know_is_refused_without_showing_it(key: str) -> None:
    dsn = f"postgresql://u@127.0.0.1:{free_port()}/db?{key}={SECRET}"
    for make in (PostgresStore, AsyncPostgresStore, postgres_module.open_postgres_url):
        with pytest.raises(ConfigurationError) as info:
            make(dsn)
        assert SECRET not in everything_said(info.value)
        assert "***" in str(info.value)


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://h:99999/db",
        "postgresql://h:0/db",
        "postgresql://h:5432,h2:70000/db",
        "postgresql://[::1/db",
        f"postgresql://u:{SECRET}@[::1/db",
        "postgresql://u@h/db?schema=a&schema=b",
        "host='unterminated",
        f"host=h password='{SECRET}",
        "host=h port=99999",
    ],
)
def test_a_dsn_that_cannot_be_parsed_is_a_configuration_error(dsn: str) -> None:
    makers: list[Callable[[str], object]] = [
        postgres_module.open_postgres_url,
        PostgresStore,
        AsyncPostgresStore,
    ]
    if "://" in dsn:
        makers.append(open_store)
    for make in makers:
        with pytest.raises(ConfigurationError) as info:
            make(dsn)
        assert SECRET not in everything_said(info.value)
        assert not isinstance(info.value.__cause__, (ValueError, psycopg.Error)), "chained"


def test_open_postgres_url_takes_a_key_value_dsn_with_a_schema(dsn: str, schema: str) -> None:
    parts = urlsplit(dsn)
    key_value = (
        f"host={parts.hostname} port={parts.port or 5432} user={parts.username} "
        f"dbname={parts.path.lstrip('/')} schema={schema}"
    )
    with postgres_module.open_postgres_url(key_value) as store:
        assert store.schema == schema
        assert "schema" not in store.dsn
        store.append("s", [Message(Role.USER, "hi")])
        assert [m.content for m in store.history("s")] == ["hi"]
    with pytest.raises(ConfigurationError, match="once"):
        postgres_module.open_postgres_url(f"{key_value} schema=other")


def test_open_store_takes_postgres_urls_and_a_schema(dsn: str, schema: str) -> None:
    joined = f"{dsn}&schema={schema}" if "?" in dsn else f"{dsn}?schema={schema}"
    store = open_store(joined)
    assert isinstance(store, PostgresStore)
    assert store.schema == schema
    store.append("s", [Message(Role.USER, "hi")])
    store.close()
    other = open_store(joined.replace("postgresql://", "postgres://", 1))
    assert [m.content for m in other.history("s")] == ["hi"]
    other.close()
    with pytest.raises(ConfigurationError, match="once"):
        open_store(joined, schema="other")
    with pytest.raises(ConfigurationError, match="schema"):
        open_store("postgresql://u@h/db?schema=no-dashes")


def test_the_native_async_store_of_a_postgres_url_reads_the_same_data(
    dsn: str, schema: str
) -> None:
    """What zerda serve answers through: the AsyncPostgresStore of the same URL and schema."""
    from zerda.stores._open import open_native_async

    joined = f"{dsn}&schema={schema}" if "?" in dsn else f"{dsn}?schema={schema}"
    native = native_async_reading_what_sync_wrote(joined)
    assert isinstance(native, AsyncPostgresStore)
    assert native.schema == schema
    assert open_native_async("memory:") is None


# -- schema and migrations ---------------------------------------------------------------------


def applied(dsn: str, schema: str) -> list[tuple[str, float]]:
    with raw(dsn) as conn:
        rows = conn.execute(
            f'SELECT name, applied_at FROM "{schema}"._zerda_migrations ORDER BY id'
        ).fetchall()
    return [(name, at) for name, at in rows]


def test_schema_is_created_on_first_use_and_migrations_recorded_once(dsn: str, schema: str) -> None:
    store = PostgresStore(dsn, schema=schema)
    assert not schema_exists(dsn, schema), "constructing a store created the schema"
    store.append("s", [Message(Role.USER, "kept")])
    assert schema_exists(dsn, schema)
    first = applied(dsn, schema)
    assert [name for name, _ in first] == [m.__name__ for m in MIGRATIONS]
    assert store.schema_version() == len(MIGRATIONS) >= 2
    store.close()
    with PostgresStore(dsn, schema=schema) as again:
        assert [m.content for m in again.history("s")] == ["kept"]
        assert again.migrate() == (len(MIGRATIONS), len(MIGRATIONS))
    assert applied(dsn, schema) == first, "opening again ran the migrations again"


def test_a_new_migration_is_applied_once_in_order(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with PostgresStore(dsn, schema=schema) as store:
        store.append("s", [Message(Role.USER, "kept")])
    calls: list[str] = []

    def m900_add_notes() -> list[str]:
        calls.append("m900")
        return ["CREATE TABLE {schema}.notes (text text)"]

    monkeypatch.setattr(postgres_module, "MIGRATIONS", [*MIGRATIONS, m900_add_notes])
    with PostgresStore(dsn, schema=schema) as store:
        assert store.migrate() == (len(MIGRATIONS), len(MIGRATIONS) + 1)
        assert store.schema_version() == len(MIGRATIONS) + 1
    with PostgresStore(dsn, schema=schema) as store:
        assert [m.content for m in store.history("s")] == ["kept"]
    assert calls == ["m900"]
    assert [name for name, _ in applied(dsn, schema)][-1] == "m900_add_notes"


def test_a_failing_migration_changes_nothing(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with PostgresStore(dsn, schema=schema) as store:
        store.append("s", [Message(Role.USER, "kept")])
    before = applied(dsn, schema)

    def m900_half_done() -> list[str]:
        return ["CREATE TABLE {schema}.half (x int)", "this is not SQL"]

    monkeypatch.setattr(postgres_module, "MIGRATIONS", [*MIGRATIONS, m900_half_done])
    with PostgresStore(dsn, schema=schema) as store:
        with pytest.raises(StoreUnavailableError, match="syntax error") as info:
            store.history("s")
        assert "m900_half_done" in str(info.value)
    assert applied(dsn, schema) == before
    with raw(dsn) as conn:
        assert conn.execute("SELECT to_regclass(%s)", [f'"{schema}".half']).fetchone() == (None,)
    monkeypatch.undo()
    with PostgresStore(dsn, schema=schema) as store:
        assert [m.content for m in store.history("s")] == ["kept"]


def write_version_2_session(dsn: str, schema: str) -> tuple[list[Message], dict[str, Any]]:
    """A session written as the store of schema version 2 wrote it (messages as JSONB, one
    with a NUL character as text; metadata as one JSONB object); its messages and what that
    store's get_metadata returned."""
    old = [
        Message(Role.SYSTEM, "pinned"),
        Message(Role.USER, "q", metadata={"f": 1e16}),
        Message(Role.ASSISTANT, "a\x00b"),
    ]
    bodies = [m.to_json() for m in old]
    with raw(dsn) as conn:
        conn.execute(
            f'SELECT "{schema}".zerda_append(%s, %s, NULL, NULL, %s::text[], %s::bigint[], '
            "%s::bigint[], %s::text[], %s::text[], %s::text[])",
            [
                "s",
                T0,
                ["system", "user", "assistant"],
                [0, 1, 1],
                [0, 1, 1],
                [bodies[0], bodies[1], None],
                [None, None, bodies[2]],
                ['{"x": 1}', '{"x": 2}', None],
            ],
        )
        conn.execute(
            f'SELECT "{schema}".zerda_update_metadata(%s, %s, NULL, %s::jsonb, %s::text[])',
            ["s", T0, '{"f": 1e16, "n": 1.5, "summary": {"text": "so far", "turns": 1}}', []],
        )
        [(text,)] = conn.execute(
            f"SELECT metadata::text FROM \"{schema}\".sessions WHERE session_id = 's'"
        ).fetchall()
    return old, json.loads(text)


def test_a_version_2_schema_migrates_and_its_rows_read_as_they_did(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres_module, "MIGRATIONS", MIGRATIONS[:2])
    with PostgresStore(dsn, schema=schema) as old_store:
        assert old_store.schema_version() == 2
    monkeypatch.undo()
    old, metadata = write_version_2_session(dsn, schema)
    assert canonical(metadata["f"]) == canonical(10**16), "what JSONB did"
    with PostgresStore(dsn, schema=schema, clock=FakeClock()) as store:
        assert store.migrate() == (2, len(MIGRATIONS))
        # Old rows read as they did, metadata included (1e16 had become an int).
        assert store.history("s") == old
        assert canonical(store.get_metadata("s")) == canonical(metadata)
        tail = store.tail("s", None, "x")
        assert (list(tail.tokens), list(tail.system_tokens)) == ([2, None], [1])
        assert canonical(dict(tail.metadata)) == canonical(metadata)
        # Legacy values compare as JSON values too; a write replaces them with exact text.
        assert store.compare_and_set("s", "summary", {"text": "so far", "turns": 2}, 1) is False
        assert store.compare_and_set("s", "n", "a\x00", 1) is False
        assert store.compare_and_set("s", "f", 1e16, 2e16) is True
        assert store.compare_and_set("s", "summary", {"turns": 1.0, "text": "so far"}, None)
        assert canonical(store.get_metadata("s")) == canonical({"f": 2e16, "n": 1.5})
        # New rows: exact, with ids; the turns go on from the old ones.
        new = [Message(Role.USER, "q2", metadata={"f": 1e16}, id="u2")]
        assert store.append("s", new) == 1
        assert store.append("s", new) == 0
        assert store.history("s") == [*old, *new]
        assert json.dumps(dict(store.history("s")[-1].metadata)) == '{"f": 1e+16}'
        assert store.tail("s", 1).messages == new
        assert store.tail("s", None).total_turns == 2
    with raw(dsn) as conn, pytest.raises(psycopg.errors.UndefinedColumn):
        conn.execute(f'SELECT metadata FROM "{schema}".sessions')


def test_a_newer_schema_is_refused(dsn: str, schema: str) -> None:
    with PostgresStore(dsn, schema=schema) as store:
        store.append("s", [Message(Role.USER, "kept")])
    with raw(dsn) as conn:
        conn.execute(
            f'INSERT INTO "{schema}"._zerda_migrations (name, applied_at) '
            "VALUES ('m999_from_the_future', 0)"
        )
    before = applied(dsn, schema)

    def sync_first_call() -> None:
        with PostgresStore(dsn, schema=schema) as s:
            s.tail("s", 1)

    async def async_first_call() -> None:
        async with AsyncPostgresStore(dsn, schema=schema) as s:
            await s.atail("s", 1)

    for first_call in (sync_first_call, lambda: run(async_first_call())):
        with pytest.raises(ZerdaError, match="newer") as info:
            first_call()
        assert "m999_from_the_future" in str(info.value)
        assert schema in str(info.value)
    assert applied(dsn, schema) == before


def test_first_uses_in_many_threads_migrate_once(dsn: str, schema: str) -> None:
    """Stores starting together on a missing schema: one creates it, none fails."""
    n = 6
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def first_use(w: int) -> None:
        try:
            with PostgresStore(dsn, schema=schema) as s:
                barrier.wait()
                s.append("s", [Message(Role.USER, f"{w}")])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=first_use, args=(w,)) for w in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert [name for name, _ in applied(dsn, schema)] == [m.__name__ for m in MIGRATIONS]
    with PostgresStore(dsn, schema=schema) as s:
        assert sorted(m.content or "" for m in s.history("s")) == [str(w) for w in range(n)]


def test_a_schema_dropped_under_a_store_is_created_again(dsn: str, store: PostgresStore) -> None:
    store.append("s", [Message(Role.USER, "hi")])
    drop_schemas(dsn, [store.schema])
    with pytest.raises(StoreUnavailableError, match="missing"):
        store.history("s")
    store.append("s", [Message(Role.USER, "again")])  # the schema is back, empty
    assert [m.content for m in store.history("s")] == ["again"]


# -- round trips: counted on the wire ----------------------------------------------------------


@pytest.fixture
def proxy(dsn: str) -> Iterator[RoundTripProxy]:
    parts = urlsplit(dsn)
    if parts.scheme not in ("postgresql", "postgres") or not parts.hostname:
        pytest.skip("the round-trip proxy needs a postgresql://host:port URL as test DSN")
    p = RoundTripProxy(parts.hostname, parts.port or 5432)
    yield p
    p.close()


def _operations(s: Any) -> dict[str, Callable[[], Any]]:
    """Every call of the contract, by name (the ``a``-twins for an async store), each made so
    that it can run again and again: a compare-and-set that succeeds each time, and a batch
    whose ids are held after its first append."""
    prefix = "a" if isinstance(s, AsyncPostgresStore) else ""
    batch, tokens = tagged_batch(0, 0, 3), tagged_tokens(0, 0, 3)
    held = [m.stamped() for m in tagged_batch(1, 0, 2)]
    n = itertools.count()

    def call(name: str, *args: Any) -> Callable[[], Any]:
        method = getattr(s, prefix + name)
        return lambda: method(*args)

    def compare_and_set() -> Any:
        i = next(n)
        return getattr(s, prefix + "compare_and_set")("s", "zerda.n", i or None, i + 1)

    return {
        "append": call("append", "s", batch, tokens),
        "append (ids held)": call("append", "s", held),
        "append_then_tail": call("append_then_tail", "s", batch, tokens, 3, "tag"),
        "tail": call("tail", "s", 3, "tag"),
        "history": call("history", "s"),
        "get_metadata": call("get_metadata", "s"),
        "update_metadata": call("update_metadata", "s", {"k": 1, "gone": None}),
        "compare_and_set": compare_and_set,
        "compare_and_set (fails)": call("compare_and_set", "s", "k", 2, 3),
        "list_sessions": call("list_sessions"),
        "delete_session": call("delete_session", "other"),
        "purge_expired": call("purge_expired"),
    }


def test_one_round_trip_per_call(proxy: RoundTripProxy, dsn: str, schema: str) -> None:
    proxied = with_port(dsn, "127.0.0.1", proxy.port)
    with PostgresStore(proxied, schema=schema, min_size=1, max_size=1) as s:
        operations = _operations(s)
        # Warm up: the schema is made, and psycopg prepares each statement at its 5th run on a
        # connection (one more round trip, once); from then on each call is one statement.
        for _ in range(6):
            for call in operations.values():
                call()
        counts = {name: proxy.count(call) for name, call in operations.items()}
        assert counts == dict.fromkeys(operations, 1)
        assert s.get_metadata("s")["zerda.n"] == 7, "every compare_and_set succeeded"
        # A memory's turn: one append, one tail read.
        memory = ConversationBufferWindowMemory(k=3, store=s, session_id="m")
        for _ in range(6):
            memory.add_messages(tagged_batch(1, 0, 2))
            memory.get_context()
        assert proxy.count(lambda: memory.add_messages(tagged_batch(1, 1, 2))) == 1
        assert proxy.count(memory.get_context) == 1


def test_async_store_one_round_trip_per_call(proxy: RoundTripProxy, dsn: str, schema: str) -> None:
    proxied = with_port(dsn, "127.0.0.1", proxy.port)

    async def main() -> dict[str, int]:
        async with AsyncPostgresStore(proxied, schema=schema, min_size=1, max_size=1) as s:
            operations = _operations(s)
            for _ in range(6):
                for call in operations.values():
                    await call()
            counts = {}
            for name, call in operations.items():
                before = proxy.round_trips
                await call()
                counts[name] = proxy.round_trips - before
            assert (await s.aget_metadata("s"))["zerda.n"] == 7
            return counts

    counts = run(main())
    assert counts == dict.fromkeys(_operations(PostgresStore("postgresql://u@h/db")), 1)


def test_the_proxy_does_count_every_round_trip(proxy: RoundTripProxy, dsn: str) -> None:
    """The measure above could pass by counting too little, or by counting segments."""
    with psycopg.connect(with_port(dsn, "127.0.0.1", proxy.port), autocommit=True) as conn:
        assert proxy.count(lambda: [conn.execute("SELECT 1") for _ in range(3)]) == 3
        # One statement of a megabyte crosses in many TCP segments, and is one round trip.
        assert proxy.count(lambda: conn.execute("SELECT length(%s)", ["x" * 2**20])) == 1


# -- tail reads use the primary key and read what they return ---------------------------------


def _plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _plan_nodes(child)


def test_tail_query_reads_two_primary_key_ranges(dsn: str, store: PostgresStore) -> None:
    for n in range(40):
        store.append(f"other{n:02d}", conversation(100, tag=f"o{n}"))
    store.append("small", conversation(5))
    store.append("big", conversation(3000))
    with raw(dsn) as conn:
        conn.execute(f'ANALYZE "{store.schema}".sessions')
        conn.execute(f'ANALYZE "{store.schema}".messages')
        for session, turns in (("small", 2), ("big", 2), ("big", 10), ("big", 0)):
            query = next(store._tail(session, turns, "x"))
            [(explained,)] = conn.execute(
                f"EXPLAIN (ANALYZE, FORMAT JSON) {query.text}", query.params
            ).fetchall()
            nodes = list(_plan_nodes(explained[0]["Plan"]))
            on_messages = [node for node in nodes if node.get("Relation Name") == "messages"]
            assert len(on_messages) == 2, nodes  # the system range and the turns range
            for node in on_messages:
                assert node["Node Type"] == "Index Scan", node
                assert node["Index Name"] == "messages_pkey", node
                assert node.get("Rows Removed by Filter", 0) == 0, node
            tail = store.tail(session, turns, "x")
            read = sum(node["Actual Rows"] * node["Actual Loops"] for node in on_messages)
            # The index reads exactly the rows the tail returns, however long the session.
            assert read == len(tail.system) + len(tail.messages), (session, turns, read)


# -- sequence numbers under concurrent writers -------------------------------------------------


def check_positions(dsn: str, schema: str, session_id: str) -> int:
    """The session's stored positions are 0..n-1 exactly, turns numbered 0..t-1 in order,
    each turn's messages contiguous; returns n."""
    with raw(dsn) as conn:
        rows = conn.execute(
            f'SELECT m.seq, m.turn FROM "{schema}".messages m JOIN "{schema}".sessions s '
            "USING (sid) WHERE s.session_id = %s ORDER BY m.seq",
            [session_id],
        ).fetchall()
        [(next_seq, next_turn)] = conn.execute(
            f'SELECT next_seq, next_turn FROM "{schema}".sessions WHERE session_id = %s',
            [session_id],
        ).fetchall()
    seqs = [seq for seq, _ in rows]
    assert seqs == list(range(len(rows))), "positions are not gap-free and unique"
    assert next_seq == len(rows)
    turns = [turn for _, turn in rows if turn >= 0]
    assert turns == sorted(turns)
    assert sorted(set(turns)) == list(range(next_turn)), "turn numbers skip or repeat"
    return len(rows)


def test_positions_stay_gap_free_under_8_writer_threads(dsn: str, store: PostgresStore) -> None:
    writers, batches = 8, 60
    barrier = threading.Barrier(writers)
    errors: list[BaseException] = []

    def write(w: int) -> None:
        try:
            barrier.wait()
            for b in range(batches):
                size = 1 + (b + w) % 3
                store.append("shared", tagged_batch(w, b, size), tagged_tokens(w, b, size))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    n = check_positions(dsn, store.schema, "shared")
    assert n == sum(1 + (b + w) % 3 for w in range(writers) for b in range(batches))
    check_batches(
        store.history("shared"), writers, batches, store.tail("shared", None, "tag").tokens
    )


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_positions_stay_gap_free_under_8_writer_processes(
    dsn: str, schema: str, use_async: bool
) -> None:
    writers, batches = 8, 40
    cls = "AsyncPostgresStore" if use_async else "PostgresStore"
    recipe = (f"zerda.stores:{cls}", {"dsn": dsn, "schema": schema})
    PostgresStore(dsn, schema=schema).close()
    run_processes(
        process_writer, [(recipe, use_async, w, batches, 2, "shared") for w in range(writers)]
    )
    assert check_positions(dsn, schema, "shared") == writers * batches * 2
    with PostgresStore(dsn, schema=schema) as s:
        check_batches(s.history("shared"), writers, batches, s.tail("shared", None, "tag").tokens)


# -- many workers through memories --------------------------------------------------------------


def memory_writer(
    dsn: str, schema: str, use_async: bool, writer: int, turns: int, barrier: Any
) -> None:
    """One worker process: its own store and memory, ``turns`` turns through save_context."""
    if use_async:

        async def main() -> None:
            store = AsyncPostgresStore(dsn, schema=schema)
            memory = ConversationBufferWindowMemory(k=3, store=store, session_id="shared")
            barrier.wait(60)
            for t in range(turns):
                await memory.asave_context({"input": f"{writer}:{t}"}, {"output": f"{writer}:{t}!"})
            await store.aclose()

        asyncio.run(main())
        return
    with PostgresStore(dsn, schema=schema) as store:
        memory = ConversationBufferWindowMemory(k=3, store=store, session_id="shared")
        barrier.wait(60)
        for t in range(turns):
            memory.save_context({"input": f"{writer}:{t}"}, {"output": f"{writer}:{t}!"})


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_4_processes_x_500_turns_through_memories(dsn: str, schema: str, use_async: bool) -> None:
    writers, turns = 4, 500
    PostgresStore(dsn, schema=schema).close()
    run_processes(memory_writer, [(dsn, schema, use_async, w, turns) for w in range(writers)])
    with PostgresStore(dsn, schema=schema) as s:
        history = s.history("shared")
        assert s.tail("shared", 0).total_turns == writers * turns
    assert len(history) == 2 * writers * turns
    seen: dict[str, list[int]] = {str(w): [] for w in range(writers)}
    for question, answer in zip(history[::2], history[1::2], strict=True):
        assert (question.role, answer.role) == (Role.USER, Role.ASSISTANT)
        assert answer.content == f"{question.content}!", "a turn was split"
        writer, _, t = (question.content or "").partition(":")
        seen[writer].append(int(t))
    assert seen == {str(w): list(range(turns)) for w in range(writers)}
    check_positions(dsn, schema, "shared")


# -- TTL: expires_at and purge -------------------------------------------------------------------


def test_ttl_is_stored_as_expires_at_and_purged_with_the_messages(dsn: str, schema: str) -> None:
    clock = FakeClock()
    with PostgresStore(dsn, schema=schema, ttl=10, clock=clock) as s:
        s.append("old", conversation(3), {"x": [1] * len(conversation(3))})
        clock.advance(5)
        s.append("new", conversation(2))
        with raw(dsn) as conn:
            rows = conn.execute(
                f'SELECT session_id, updated_at, expires_at FROM "{schema}".sessions '
                "ORDER BY session_id"
            ).fetchall()
        assert rows == [("new", clock.now, clock.now + 10), ("old", clock.now - 5, clock.now + 5)]
        # A store without a TTL of its own still sees when a session written with one expires.
        with PostgresStore(dsn, schema=schema, clock=clock) as plain:
            assert {i.session_id: i.expires_at for i in plain.list_sessions()} == {
                "new": clock.now + 10,
                "old": clock.now + 5,
            }
            clock.advance(5)
            assert [i.session_id for i in plain.list_sessions()] == ["new"]
        assert s.purge_expired() == 1
        with raw(dsn) as conn:
            left = conn.execute(f'SELECT count(*) FROM "{schema}".messages').fetchone()
        assert left == (len(conversation(2)),), "the purged session's messages are gone too"
        assert s.purge_expired() == 0


def test_purge_finds_expired_sessions_through_the_index(dsn: str, schema: str) -> None:
    clock = FakeClock()
    with PostgresStore(dsn, schema=schema, ttl=10, clock=clock) as s:
        for n in range(300):
            s.update_metadata(f"s{n}", {"n": n})
        with raw(dsn) as conn:
            conn.execute(f'ANALYZE "{schema}".sessions')
            [(plan,)] = conn.execute(
                f'EXPLAIN (FORMAT JSON) DELETE FROM "{schema}".sessions WHERE expires_at <= %s',
                [clock.now + 5],
            ).fetchall()
        index = {node.get("Index Name") for node in _plan_nodes(plan[0]["Plan"])}
        assert "sessions_expires_at" in index, plan


# -- what is stored, and what comes back -----------------------------------------------------


def test_messages_are_stored_as_their_json_text_with_their_ids(
    dsn: str, store: PostgresStore
) -> None:
    exact = Message(
        Role.USER, "plain", metadata={"f": 1e16, "big": 10**40, "tiny": 5e-324}, id="m-1"
    )
    nul = Message(Role.ASSISTANT, "a\x00b")
    store.append("s", [exact, nul], {"x": [3, 4]})
    with raw(dsn) as conn:
        rows = conn.execute(
            f'SELECT body, body_text, id, tokens FROM "{store.schema}".messages ORDER BY seq'
        ).fetchall()
    assert rows == [(None, exact.to_json(), "m-1", {"x": 3}), (None, nul.to_json(), None, {"x": 4})]
    [back, _] = store.history("s")
    assert json.dumps(dict(back.metadata)) == json.dumps(dict(exact.metadata))
    assert store.history("s") == [exact, nul]


def test_metadata_is_stored_as_json_text_one_row_per_key(dsn: str, store: PostgresStore) -> None:
    store.update_metadata("s", {"f": 1e16, "t": "nul \x00", "o": {"b": 1.0, "a": [2]}, "k\x00": 1})
    with raw(dsn) as conn:
        rows = conn.execute(
            f'SELECT key, value, cmp, legacy FROM "{store.schema}".metadata ORDER BY key'
        ).fetchall()
    # The value as Python wrote it; beside it, when that differs, the text compare_and_set
    # compares (sorted keys, integral floats as ints).
    assert rows == [
        ('"f"', "1e+16", "10000000000000000", None),
        ('"k\\u0000"', "1", None, None),
        ('"o"', '{"b":1.0,"a":[2]}', '{"a":[2],"b":1}', None),
        ('"t"', '"nul \\u0000"', None, None),
    ]
    assert store.compare_and_set("s", "o", {"a": [2.0], "b": 1}, {"c": True}) is True
    assert store.compare_and_set("s", "k\x00", 1.0, None) is True
    assert store.compare_and_set("s", "t", "nul \x00", "x") is True
    assert store.get_metadata("s") == {"f": 1e16, "t": "x", "o": {"c": True}}


def test_compare_and_set_compares_as_same_json_does(store: PostgresStore) -> None:
    """Equal JSON values by Python's rules, where JSONB equality would differ: 1e23 (a float)
    is not 10**23, and a NUL character compares like any other."""
    store.update_metadata("s", {"n": 1e23, "z": "a\x00"})
    assert same_json(1e23, 10**23) is False
    assert store.compare_and_set("s", "n", 10**23, 1) is False
    assert store.compare_and_set("s", "n", 1e23, 1) is True
    assert store.compare_and_set("s", "z", "a\x01", 1) is False
    assert store.compare_and_set("s", "z", "a\x00", 1) is True


def test_text_that_is_not_unicode_is_refused_and_nothing_written(store: PostgresStore) -> None:
    with pytest.raises(ConfigurationError, match="Unicode"):
        store.append("s", [Message(Role.USER, "ok")], {"\ud800": [1]})
    assert store.list_sessions() == []


@pytest.mark.parametrize(
    ("column", "value", "match"),
    [
        ("body", '{"role": "wizard", "content": "x"}', "message"),
        ("body_text", "{not json", "message"),
        ("tokens", '{"x": "many"}', "token count"),
        ("tokens", '{"x": 1.5}', "token count"),
        ("tokens", '{"x": -1}', "token count"),
    ],
)
def test_a_row_that_cannot_be_decoded_is_corrupt_data(
    dsn: str, schema: str, column: str, value: str, match: str
) -> None:
    with PostgresStore(dsn, schema=schema) as store:
        store.append("good", [Message(Role.USER, "fine")], {"x": [1]})
        store.append("bad-one", [Message(Role.USER, "fine")], {"x": [1]})
    with raw(dsn) as conn:
        other = "body_text" if column == "body" else None  # new rows keep body_text
        assignments = f"{column} = %s" + (f", {other} = NULL" if other else "")
        conn.execute(
            f'UPDATE "{schema}".messages SET {assignments} WHERE sid = '
            f"(SELECT sid FROM \"{schema}\".sessions WHERE session_id = 'bad-one')",
            [value],
        )
    with PostgresStore(dsn, schema=schema) as fresh:  # nothing decoded before
        with pytest.raises(CorruptDataError, match=match) as info:
            fresh.tail("bad-one", None, "x")
        assert schema in str(info.value)
        assert "'bad-one'" in str(info.value)
        if column != "tokens":
            with pytest.raises(CorruptDataError, match="'bad-one'"):
                fresh.history("bad-one")
        assert [m.content for m in fresh.history("good")] == ["fine"]


def test_a_pool_given_is_used_as_it_is_and_left_open(dsn: str, schema: str) -> None:
    # Connections that are not in autocommit mode: the store switches them while it uses
    # them (no round trip on an idle connection) and leaves them as they were.
    pool = ConnectionPool(dsn, min_size=1, max_size=2, kwargs={"autocommit": False}, open=True)
    try:
        with PostgresStore(pool=pool, schema=schema) as s:
            s.append("s", [Message(Role.USER, "hi")])
            assert [m.content for m in s.history("s")] == ["hi"]
            assert s.dsn == redact(dsn)
        assert not pool.closed
        with pool.connection() as conn:
            assert conn.autocommit is False
            row = conn.execute(f'SELECT count(*) FROM "{schema}".messages').fetchone()
            assert row == (1,)
    finally:
        pool.close()

    async def main() -> None:
        apool = AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False)
        await apool.open()
        try:
            async with AsyncPostgresStore(pool=apool, schema=schema) as s:
                assert [m.content for m in await s.ahistory("s")] == ["hi"]
            assert not apool.closed
        finally:
            await apool.close()

    run(main())


def test_a_closed_store_says_so(store: PostgresStore) -> None:
    store.append("s", [Message(Role.USER, "hi")])
    store.close()
    for call in (lambda: store.append("s", []), lambda: store.tail("s", 1), store.list_sessions):
        with pytest.raises(StoreUnavailableError, match="closed"):
            call()
    store.close()


# -- the async store ---------------------------------------------------------------------------


def test_async_store_is_only_an_async_store(dsn: str, schema: str) -> None:
    store = AsyncPostgresStore(dsn, schema=schema)
    assert isinstance(store, AsyncStore)
    assert not isinstance(store, Store)
    assert not hasattr(store, "append")
    assert not hasattr(store, "migrate")
    run(store.aclose())


def test_memory_over_async_store_is_native_and_matches_the_sync_store(
    dsn: str, schema: str
) -> None:
    async def main() -> list[Message]:
        async with AsyncPostgresStore(dsn, schema=schema) as store:
            assert await store.amigrate() == (0, len(MIGRATIONS))
            assert await store.aschema_version() == len(MIGRATIONS)
            memory = ConversationTokenBufferMemory(
                80, token_counter=ApproxCounter(), store=store, session_id="c"
            )
            for m in conversation(6):
                await memory.aadd_message(m)
            with pytest.raises(ZerdaError, match="async"):
                memory.get_context()
            return await memory.aget_context()

    context = run(main())
    with PostgresStore(dsn, schema=schema) as sync:
        same = ConversationTokenBufferMemory(
            80, token_counter=ApproxCounter(), store=sync, session_id="c"
        )
        assert same.get_context() == context
        assert len(context) < len(conversation(6))
        tail = sync.tail("c", None, ApproxCounter().name)
        assert None not in tail.tokens, "the counts were stored with the messages"


# -- an unreachable server --------------------------------------------------------------------


def test_a_dead_server_is_store_unavailable_naming_the_dsn_without_password() -> None:
    dead = f"postgresql://ada:sekret@127.0.0.1:{free_port()}/chats"
    store = PostgresStore(dead, timeout=1)
    for call in (lambda: store.append("s", [Message(Role.USER, "x")]), store.list_sessions):
        with pytest.raises(StoreUnavailableError) as info:
            call()
        message = str(info.value)
        assert "postgresql://ada:***@127.0.0.1" in message
        assert "sekret" not in message
        assert isinstance(info.value.__cause__, psycopg.OperationalError)
        assert "refused" in message.lower() or "connect" in message.lower()
    store.close()

    async def main() -> None:
        async with AsyncPostgresStore(dead, timeout=1) as astore:
            with pytest.raises(StoreUnavailableError) as ainfo:
                await astore.atail("s", 1)
            assert "sekret" not in str(ainfo.value)
            assert isinstance(ainfo.value.__cause__, psycopg.OperationalError)

    run(main())


# -- the fault test: a private cluster stopped hard mid-run, then started again ------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with private_cluster() as c:
        yield c


def _check_survivors(history: list[Message], acknowledged: list[int], after: str) -> None:
    """Every acknowledged turn is there, whole and in order; at most the one turn that was in
    flight when the server died is there too (committed, its answer lost); then ``after``."""
    contents = [m.content for m in history]
    assert contents[-2:] == [after, f"{after}!"], "the turn written after the restart"
    turns = [contents[i : i + 2] for i in range(0, len(contents) - 2, 2)]
    numbers = [int(q or "") for q, _ in turns]
    assert [a for _, a in turns] == [f"{n}!" for n in numbers], "a turn was split"
    assert numbers[: len(acknowledged)] == acknowledged, "an acknowledged turn was lost"
    assert len(numbers) - len(acknowledged) in (0, 1)
    if len(numbers) > len(acknowledged):
        assert numbers[-1] == acknowledged[-1] + 1


def test_server_stopped_hard_mid_run_then_back(cluster: Cluster) -> None:
    if not cluster.running():
        cluster.start()
    store = PostgresStore(cluster.dsn, schema=fresh_schema("fault"), timeout=2)
    memory = ConversationBufferWindowMemory(k=3, store=store, session_id="f")
    acknowledged: list[int] = []
    failures: list[BaseException] = []
    running = threading.Event()

    def writer() -> None:
        # Writes until three calls in a row have failed: the server is gone.
        t = 0
        while len(failures) < 3:
            try:
                memory.save_context({"input": str(t)}, {"output": f"{t}!"})
            except BaseException as exc:
                failures.append(exc)
                continue
            failures.clear()
            acknowledged.append(t)
            t += 1
            if t == 30:
                running.set()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert running.wait(120), "the writer did not get going"
        cluster.stop_hard()  # while the writer writes
    finally:
        thread.join(timeout=120)
    assert not thread.is_alive()
    assert len(acknowledged) >= 30
    for exc in failures:
        assert isinstance(exc, StoreUnavailableError), repr(exc)
        assert isinstance(exc.__cause__, psycopg.Error), repr(exc.__cause__)
    with pytest.raises(StoreUnavailableError):
        memory.get_context()

    cluster.start()
    # The same memory and store: the pool drops the dead connections and makes new ones.
    memory.save_context({"input": "after"}, {"output": "after!"})
    _check_survivors(memory.get_history(), acknowledged, "after")
    assert [m.content for m in memory.get_context()][-2:] == ["after", "after!"]
    store.close()


def test_async_store_server_stopped_hard_mid_run_then_back(cluster: Cluster) -> None:
    if not cluster.running():
        cluster.start()
    schema = fresh_schema("afault")

    async def main() -> None:
        store = AsyncPostgresStore(cluster.dsn, schema=schema, timeout=2)
        memory = ConversationBufferWindowMemory(k=3, store=store, session_id="f")
        acknowledged: list[int] = []
        failures: list[BaseException] = []
        running = asyncio.Event()

        async def writer() -> None:
            t = 0
            while len(failures) < 3:
                try:
                    await memory.asave_context({"input": str(t)}, {"output": f"{t}!"})
                except Exception as exc:
                    failures.append(exc)
                    continue
                failures.clear()
                acknowledged.append(t)
                t += 1
                if t == 30:
                    running.set()

        writing = asyncio.create_task(writer())
        await asyncio.wait_for(running.wait(), 120)
        await asyncio.to_thread(cluster.stop_hard)  # the writer keeps writing meanwhile
        await asyncio.wait_for(writing, 120)
        for exc in failures:
            assert isinstance(exc, StoreUnavailableError), repr(exc)
        with pytest.raises(StoreUnavailableError):
            await memory.aget_context()
        await asyncio.to_thread(cluster.start)
        await memory.asave_context({"input": "after"}, {"output": "after!"})
        _check_survivors(await memory.aget_history(), acknowledged, "after")
        await store.aclose()

    run(main())


# -- the CLI against Postgres ----------------------------------------------------------------


def zerda(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ZERDA_DB", "COLUMNS")}
    env.update({"XDG_DATA_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path), "TZ": "UTC"})
    env["PYTHONIOENCODING"] = "utf-8"
    return subprocess.run(
        [sys.executable, "-m", "zerda.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )


def target(dsn: str, schema: str) -> str:
    return f"{dsn}&schema={schema}" if "?" in dsn else f"{dsn}?schema={schema}"


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout


def test_cli_against_postgres(dsn: str, schema: str, tmp_path: Path) -> None:
    db = target(dsn, schema)
    ok(zerda("import", str(EXAMPLE), "--session", "demo", "--db", db, tmp_path=tmp_path))
    sessions = json.loads(ok(zerda("sessions", "--db", db, "--json", tmp_path=tmp_path)))
    expected = [Message.from_dict(json.loads(x)) for x in EXAMPLE.read_text().splitlines()]
    assert [(s["session_id"], s["messages"]) for s in sessions] == [("demo", len(expected))]
    shown = json.loads(
        ok(zerda("show", "demo", "--k", "2", "--json", "--db", db, tmp_path=tmp_path))
    )
    with PostgresStore(dsn, schema=schema) as store:
        memory = ConversationBufferWindowMemory(k=2, store=store, session_id="demo")
        assert shown["context"]["messages"] == [m.to_openai() for m in memory.get_context()]
        assert [m.content for m in store.history("demo")] == [m.content for m in expected]
    exported = ok(zerda("export", "demo", "--db", db, tmp_path=tmp_path))
    assert [json.loads(line) for line in exported.splitlines()] == [m.to_openai() for m in expected]
    stats = json.loads(ok(zerda("stats", "--json", "--db", db, tmp_path=tmp_path)))
    assert (stats["backend"], stats["schema_version"], stats["messages"]) == (
        "postgres",
        len(MIGRATIONS),
        len(expected),
    )
    assert "Removed session demo" in ok(zerda("rm", "demo", "--db", db, tmp_path=tmp_path))
    assert json.loads(ok(zerda("sessions", "--json", "--db", db, tmp_path=tmp_path))) == []


def test_cli_migrate_postgres(dsn: str, schema: str, tmp_path: Path) -> None:
    db = target(dsn, schema)
    first = ok(zerda("migrate", "--db", db, tmp_path=tmp_path))
    assert f"version 0 -> {len(MIGRATIONS)}" in first
    assert schema_exists(dsn, schema)
    again = json.loads(ok(zerda("migrate", "--db", db, "--json", tmp_path=tmp_path)))
    assert again == {
        "target": db,
        "backend": "postgres",
        "schema": True,
        "version_before": len(MIGRATIONS),
        "version_after": len(MIGRATIONS),
        "applied": 0,
    }
    assert [name for name, _ in applied(dsn, schema)] == [m.__name__ for m in MIGRATIONS]


def test_cli_with_an_unreachable_postgres_is_one_line_without_password(tmp_path: Path) -> None:
    db = f"postgresql://ada:sekret@127.0.0.1:{free_port()}/chats?schema=nowhere"
    for args in (("sessions",), ("migrate",)):
        done = zerda(*args, "--db", db, tmp_path=tmp_path)
        assert done.returncode == 1
        lines = done.stderr.splitlines()
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith("zerda: error: Postgres store postgresql://ada:***@127.0.0.1")
        assert "sekret" not in done.stderr + done.stdout


# -- the benchmark runs ------------------------------------------------------------------------

SHARED_DATA = ROOT.parent / "shared" / "data" / "taskmaster4-coffee.jsonl.gz"


@pytest.mark.skipif(not SHARED_DATA.exists(), reason=f"shared data set not found at {SHARED_DATA}")
def test_the_benchmark_runs(dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "postgres_store.py"),
            f"--dsn={dsn}",
            "--sizes=1000,2000",
            "--turns=20",
            "--repeat=1",
            "--clients=3",
            "--async-turns=10",
            f"--json={out}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert [r["messages_in_session"] >= 1000 for r in result["per_turn"]] == [True] * 4
    assert {r["round_trips"] for r in result["round_trips"][:2]} == {1}, "append and tail"
    assert [r["clients"] for r in result["throughput"]] == [1, 3]
    assert "| Postgres µs/turn |" in done.stdout
    assert result["schema"].startswith("zerda_bench_")
    assert not schema_exists(dsn, result["schema"]), "the benchmark left its schema behind"

"""The Postgres store: sessions shared by many workers, on psycopg 3 and psycopg_pool."""

from __future__ import annotations

import asyncio
import json
import math
import re
import select
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from zerda.errors import (
    ConfigurationError,
    CorruptDataError,
    StoreUnavailableError,
    ZerdaError,
)
from zerda.messages import Message, Role
from zerda.stores._base import (
    EMPTY_TAIL,
    AsyncClosingStore,
    ClosingStore,
    DecodedMessages,
    SessionInfo,
    Tail,
    TokenCounts,
    check_batch,
    check_retention,
    check_session_id,
    metadata_copy,
)

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict
    from psycopg.rows import tuple_row
    from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolClosed, PoolTimeout
except ImportError as exc:  # pragma: no cover - the extra is installed wherever tests run
    raise ImportError(
        "the Postgres store needs psycopg 3 and psycopg_pool: pip install 'zerda-memory[postgres]'"
    ) from exc

__all__ = ["MIGRATIONS", "AsyncPostgresStore", "PostgresStore", "open_postgres_url"]

_USER, _SYSTEM = Role.USER, Role.SYSTEM

# System messages belong to no turn; they are stored under this turn number, so that they sort
# before every turn of their session and read as one short range of the primary key.
SYSTEM_TURN = -1
# Decoded messages kept per store, by stored text (as the SQLite store does).
_CACHE_SIZE = 4096
# Postgres truncates longer identifiers silently; refuse them instead.
_MAX_SCHEMA_LENGTH = 63
_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A ``turns`` argument beyond this is "all of them" (and stays inside bigint).
_MAX_TURNS = 2**62
# A call waiting for a connection looks up this often whether the pool's attempt to make one
# has failed, so that it fails then rather than when the pool's timeout runs out.
_WAIT_SLICE = 0.1

Rows = list[tuple[Any, ...]]


# -- schema migrations ------------------------------------------------------------------------
#
# Ordered, named functions, each applied once and recorded by name in the schema's
# ``_zerda_migrations`` table. A migration returns SQL statements (templates where ``{schema}``
# is the store's schema, quoted by psycopg.sql.Identifier), so that the sync and the async
# store run the very same ones. Add a migration by appending a function; never edit or reorder
# one that has shipped.

Migration = Callable[[], list[str]]
MIGRATIONS: list[Migration] = []


def _migration(fn: Migration) -> Migration:
    MIGRATIONS.append(fn)
    return fn


@_migration
def m001_sessions_and_messages() -> list[str]:
    return [
        # A session's counters describe its log without reading it: messages hold absolute
        # positions ``seq`` and turn numbers ``turn``; retention moves ``first_seq`` and
        # ``first_turn`` forward. ``expires_at`` is updated_at plus the TTL of the store that
        # wrote last (NULL: it never expires), indexed so that a purge finds what expired
        # without scanning every session. "C" collation: ids sort by code point, as
        # list_sessions promises, and compare byte by byte.
        """
        CREATE TABLE {schema}.sessions (
            sid bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            session_id text COLLATE "C" NOT NULL UNIQUE,
            created_at double precision NOT NULL,
            updated_at double precision NOT NULL,
            expires_at double precision,
            metadata jsonb NOT NULL DEFAULT '{{}}' CHECK (jsonb_typeof(metadata) = 'object'),
            next_seq bigint NOT NULL DEFAULT 0,
            first_seq bigint NOT NULL DEFAULT 0,
            next_turn bigint NOT NULL DEFAULT 0,
            first_turn bigint NOT NULL DEFAULT 0,
            system_trimmed bigint NOT NULL DEFAULT 0
        )
        """,
        """
        CREATE INDEX sessions_expires_at ON {schema}.sessions (expires_at)
            WHERE expires_at IS NOT NULL
        """,
        # Two keys, each doing one job:
        # - PRIMARY KEY (sid, turn, seq) is the tail key: the newest k turns of a session are
        #   one range of it (turn >= next_turn - k), read in order, and the system messages
        #   (turn -1) are another short range. An index on (session, seq DESC) alone cannot
        #   say where the k-th newest turn starts without walking messages until it has seen
        #   k user messages; this key knows it from the session row.
        # - UNIQUE (sid, seq) makes a duplicate position impossible rather than unlikely,
        #   gives history() its order, and lets retention find its cut in one probe.
        # ``body`` is Message.to_dict() as JSONB; the rare message JSONB cannot hold (a NUL
        # character, \u0000, anywhere in it) keeps its JSON text in ``body_text`` instead.
        # ``tokens`` is {"counter name": count, ...}. No foreign key to sessions: its check
        # would cost a lookup per inserted row, and only the functions below write here,
        # always under the session row's lock.
        """
        CREATE TABLE {schema}.messages (
            sid bigint NOT NULL,
            turn bigint NOT NULL,
            seq bigint NOT NULL,
            role text NOT NULL,
            body jsonb,
            body_text text,
            tokens jsonb,
            PRIMARY KEY (sid, turn, seq),
            UNIQUE (sid, seq),
            CHECK ((body IS NULL) <> (body_text IS NULL)),
            CHECK (jsonb_typeof(body) = 'object'),
            CHECK (jsonb_typeof(tokens) = 'object')
        )
        """,
    ]


@_migration
def m002_write_functions() -> list[str]:
    # Every write is one call of one of these functions: one statement, so one round trip and
    # one transaction on an autocommit connection. Each starts by taking the session row's
    # lock (zerda_writable): writers of one session queue there, which is what keeps seq
    # numbers gap-free and unique and batches whole; writers of other sessions do not wait.
    return [
        """
        CREATE FUNCTION {schema}.zerda_writable(p_session text, p_now double precision)
        RETURNS {schema}.sessions LANGUAGE plpgsql AS $$
        DECLARE
            s {schema}.sessions;
        BEGIN
            LOOP
                SELECT * INTO s FROM {schema}.sessions
                    WHERE session_id = p_session FOR UPDATE;
                EXIT WHEN FOUND;
                INSERT INTO {schema}.sessions (session_id, created_at, updated_at)
                    VALUES (p_session, p_now, p_now)
                    ON CONFLICT (session_id) DO NOTHING
                    RETURNING * INTO s;
                IF FOUND THEN
                    RETURN s;
                END IF;
                -- Another writer created it meanwhile: loop to queue on its lock.
            END LOOP;
            IF s.expires_at IS NOT NULL AND s.expires_at <= p_now THEN
                -- Expired (reads already saw it as absent): a write starts it afresh.
                DELETE FROM {schema}.messages WHERE sid = s.sid;
                UPDATE {schema}.sessions SET created_at = p_now, updated_at = p_now,
                        expires_at = NULL, metadata = '{{}}', next_seq = 0, first_seq = 0,
                        next_turn = 0, first_turn = 0, system_trimmed = 0
                    WHERE sid = s.sid
                    RETURNING * INTO s;
            END IF;
            RETURN s;
        END
        $$
        """,
        # p_users[i]: user messages among the batch's first i; p_opens[i]: the same, counting
        # the first non-system message too, for a session that has no turn yet. They give each
        # message its turn whichever state the locked session is in.
        """
        CREATE FUNCTION {schema}.zerda_append(
            p_session text, p_now double precision, p_expires double precision,
            p_keep bigint, p_roles text[], p_users bigint[], p_opens bigint[],
            p_bodies text[], p_texts text[], p_tokens text[]
        ) RETURNS void LANGUAGE plpgsql AS $$
        DECLARE
            s {schema}.sessions;
            v_n bigint := coalesce(cardinality(p_roles), 0);
            v_next_seq bigint;
            v_next_turn bigint;
            v_cut_turn bigint;
            v_cut_seq bigint;
        BEGIN
            s := {schema}.zerda_writable(p_session, p_now);
            IF v_n > 0 THEN
                INSERT INTO {schema}.messages (sid, turn, seq, role, body, body_text, tokens)
                SELECT s.sid,
                       CASE WHEN b.role = 'system' THEN -1
                            WHEN s.next_turn > 0 THEN s.next_turn - 1 + b.users
                            ELSE b.opens - 1 END,
                       s.next_seq + b.i - 1, b.role, b.body::jsonb, b.body_text,
                       b.tokens::jsonb
                FROM unnest(p_roles, p_users, p_opens, p_bodies, p_texts, p_tokens)
                    WITH ORDINALITY AS b(role, users, opens, body, body_text, tokens, i);
            END IF;
            v_next_seq := s.next_seq + v_n;
            v_next_turn := CASE WHEN s.next_turn > 0 THEN s.next_turn + coalesce(p_users[v_n], 0)
                                ELSE coalesce(p_opens[v_n], 0) END;
            IF p_keep IS NOT NULL AND v_next_seq - s.first_seq > p_keep THEN
                -- Keep at least p_keep messages by whole turns: the cut is the turn of the
                -- newest non-system message at or before the limit (that turn starts at or
                -- before it, and every later turn after it).
                SELECT turn INTO v_cut_turn FROM {schema}.messages
                    WHERE sid = s.sid AND seq <= v_next_seq - p_keep AND turn >= 0
                    ORDER BY seq DESC LIMIT 1;
                IF v_cut_turn > s.first_turn THEN
                    SELECT min(seq) INTO v_cut_seq FROM {schema}.messages
                        WHERE sid = s.sid AND turn = v_cut_turn;
                    DELETE FROM {schema}.messages
                        WHERE sid = s.sid AND turn >= s.first_turn AND turn < v_cut_turn;
                    s.first_seq := v_cut_seq;
                    s.first_turn := v_cut_turn;
                    -- System messages are pinned: those before the cut stay, counted here.
                    SELECT count(*) INTO s.system_trimmed FROM {schema}.messages
                        WHERE sid = s.sid AND turn = -1 AND seq < v_cut_seq;
                END IF;
            END IF;
            UPDATE {schema}.sessions SET updated_at = p_now, expires_at = p_expires,
                    next_seq = v_next_seq, next_turn = v_next_turn, first_seq = s.first_seq,
                    first_turn = s.first_turn, system_trimmed = s.system_trimmed
                WHERE sid = s.sid;
        END
        $$
        """,
        """
        CREATE FUNCTION {schema}.zerda_update_metadata(
            p_session text, p_now double precision, p_expires double precision,
            p_set jsonb, p_drop text[]
        ) RETURNS void LANGUAGE plpgsql AS $$
        DECLARE
            s {schema}.sessions;
        BEGIN
            s := {schema}.zerda_writable(p_session, p_now);
            UPDATE {schema}.sessions
                SET metadata = (metadata || p_set) - p_drop, updated_at = p_now,
                    expires_at = p_expires
                WHERE sid = s.sid;
        END
        $$
        """,
        """
        CREATE FUNCTION {schema}.zerda_delete(p_session text, p_now double precision)
        RETURNS boolean LANGUAGE plpgsql AS $$
        DECLARE
            s {schema}.sessions;
        BEGIN
            SELECT * INTO s FROM {schema}.sessions WHERE session_id = p_session FOR UPDATE;
            IF NOT FOUND THEN
                RETURN false;
            END IF;
            DELETE FROM {schema}.messages WHERE sid = s.sid;
            DELETE FROM {schema}.sessions WHERE sid = s.sid;
            RETURN s.expires_at IS NULL OR s.expires_at > p_now;
        END
        $$
        """,
        # The messages go in a second statement, whose snapshot sees every message committed
        # for those sessions (a writer that held a session's lock first has committed by the
        # time its row could be deleted).
        """
        CREATE FUNCTION {schema}.zerda_purge(p_now double precision)
        RETURNS bigint LANGUAGE plpgsql AS $$
        DECLARE
            v_sids bigint[];
        BEGIN
            WITH gone AS (
                DELETE FROM {schema}.sessions WHERE expires_at <= p_now RETURNING sid
            )
            SELECT array_agg(sid) INTO v_sids FROM gone;
            DELETE FROM {schema}.messages WHERE sid = ANY (v_sids);
            RETURN coalesce(cardinality(v_sids), 0);
        END
        $$
        """,
    ]


# -- SQL (templates; each store renders them once for its schema) ------------------------------

# The arrays go in binary: psycopg's text format would escape every quote of every JSON body
# (a regular expression callback per quote: the largest cost of an append on the client).
_APPEND = (
    "SELECT {schema}.zerda_append(%s, %s, %s, %s, %b::text[], %b::bigint[], %b::bigint[], "
    "%b::text[], %b::text[], %b::text[])"
)
_LIVE = "(expires_at IS NULL OR expires_at > %(now)s)"
# One statement: the session row (totals, and where the asked-for turns start), then its
# system messages and the newest turns: two ranges of the primary key. A live session always
# gives one row at least (NULL message columns when it has no message to return).
TAIL_QUERY = (
    "WITH s AS ("
    " SELECT sid, next_seq - first_seq + system_trimmed AS total_messages,"
    " next_turn - first_turn AS total_turns,"
    " CASE WHEN %(turns)s::bigint IS NULL THEN first_turn"
    " ELSE greatest(next_turn - %(turns)s::bigint, first_turn) END AS from_turn"
    " FROM {schema}.sessions WHERE session_id = %(session)s AND " + _LIVE + ") "
    "SELECT s.total_messages, s.total_turns, m.turn, m.body, m.count "
    "FROM s LEFT JOIN LATERAL ("
    " SELECT turn, seq, coalesce(body::text, body_text) AS body,"
    " (tokens -> %(counter)s::text)::text AS count"
    " FROM {schema}.messages WHERE sid = s.sid AND turn = -1"
    " UNION ALL"
    " SELECT turn, seq, coalesce(body::text, body_text), (tokens -> %(counter)s::text)::text"
    " FROM {schema}.messages WHERE sid = s.sid AND turn >= s.from_turn"
    ") m ON true "
    "ORDER BY m.turn, m.seq"
)
_HISTORY = (
    "SELECT coalesce(m.body::text, m.body_text) FROM {schema}.sessions s"
    " JOIN {schema}.messages m ON m.sid = s.sid"
    " WHERE s.session_id = %(session)s AND (s.expires_at IS NULL OR s.expires_at > %(now)s)"
    " ORDER BY m.seq"
)
_METADATA = (
    "SELECT metadata::text FROM {schema}.sessions WHERE session_id = %(session)s AND " + _LIVE
)
_UPDATE_METADATA = "SELECT {schema}.zerda_update_metadata(%s, %s, %s, %s::jsonb, %s::text[])"
_LIST = (
    "SELECT session_id, next_seq - first_seq + system_trimmed, next_turn - first_turn,"
    " created_at, updated_at, expires_at FROM {schema}.sessions WHERE "
    + _LIVE
    + " ORDER BY session_id"
)
_DELETE = "SELECT {schema}.zerda_delete(%s, %s)"
_CLEAR = "TRUNCATE {schema}.messages, {schema}.sessions"
_PURGE = "SELECT {schema}.zerda_purge(%s)"

# Migrating: run in one transaction, under an advisory lock per schema, so that processes
# starting together do not race to create it.
_MIGRATIONS_TABLE = "{schema}._zerda_migrations"
_APPLIED = "SELECT name FROM {schema}._zerda_migrations ORDER BY id"
_HAS_MIGRATIONS_TABLE = "SELECT to_regclass(%s) IS NOT NULL"
_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
_CREATE_SCHEMA = "CREATE SCHEMA IF NOT EXISTS {schema}"
_CREATE_MIGRATIONS = (
    "CREATE TABLE IF NOT EXISTS {schema}._zerda_migrations ("
    " id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    " name text NOT NULL UNIQUE, applied_at double precision NOT NULL)"
)
_RECORD = "INSERT INTO {schema}._zerda_migrations (name, applied_at) VALUES (%s, %s)"


class _Query(NamedTuple):
    """One statement to run and what it does (for error messages)."""

    text: str
    params: Sequence[Any] | Mapping[str, Any] | None
    doing: str


class _Sql:
    """The statements of one store, rendered for its schema."""

    def __init__(self, schema: str) -> None:
        self._schema = sql.Identifier(schema)
        render = self.render
        self.append = render(_APPEND)
        self.tail = render(TAIL_QUERY)
        self.history = render(_HISTORY)
        self.metadata = render(_METADATA)
        self.update_metadata = render(_UPDATE_METADATA)
        self.list = render(_LIST)
        self.delete = render(_DELETE)
        self.clear = render(_CLEAR)
        self.purge = render(_PURGE)
        self.applied = render(_APPLIED)
        self.migrations_table = render(_MIGRATIONS_TABLE)
        self.create_schema = render(_CREATE_SCHEMA)
        self.create_migrations = render(_CREATE_MIGRATIONS)
        self.record = render(_RECORD)

    def render(self, template: str) -> str:
        """``template`` with ``{schema}`` replaced by the quoted schema name."""
        return sql.SQL(template).format(schema=self._schema).as_string(None)


# -- options ----------------------------------------------------------------------------------


def _check_schema(schema: object) -> str:
    if not isinstance(schema, str) or not _SCHEMA_NAME.fullmatch(schema):
        raise ConfigurationError(
            f"schema must be a Postgres identifier (a letter or _, then letters, digits or _), "
            f"got {schema!r}"
        )
    if len(schema) > _MAX_SCHEMA_LENGTH:
        raise ConfigurationError(
            f"schema must be at most {_MAX_SCHEMA_LENGTH} characters, got {len(schema)}"
        )
    if schema.lower().startswith("pg_"):
        raise ConfigurationError(f"schema names starting with pg_ are Postgres's own: {schema!r}")
    return schema


def _check_dsn(dsn: object) -> dict[str, Any]:
    if not isinstance(dsn, str) or not dsn.strip():
        raise ConfigurationError(
            f"dsn must be a connection string (postgresql://user@host/db or 'host=... "
            f"dbname=...'), got {dsn!r}"
        )
    try:
        return conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise ConfigurationError(
            f"dsn {redacted_dsn(dsn)!r} is not a valid connection string: {exc}"
        ) from None


def _check_sizes(min_size: int, max_size: int, timeout: float) -> float:
    for name, value in (("min_size", min_size), ("max_size", max_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigurationError(f"{name} must be an integer >= 0, got {value!r}")
    if max_size < max(1, min_size):
        raise ConfigurationError(
            f"max_size must be >= 1 and >= min_size ({min_size}), got {max_size}"
        )
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not 0 < timeout < math.inf
    ):
        raise ConfigurationError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    return float(timeout)


# ``password=value`` in a key/value connection string, the value maybe quoted.
_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s']+)")


def redacted_dsn(dsn: str) -> str:
    """``dsn`` without its password, for messages and reprs."""
    if "://" not in dsn:
        return _PASSWORD.sub(r"\1***", dsn)
    try:
        parts = urlsplit(dsn)
        netloc = parts.netloc
        if parts.password is not None:
            user, _, host = netloc.rpartition("@")
            netloc = f"{user.partition(':')[0]}:***@{host}"
        query = urlencode(
            [
                (k, "***" if k == "password" else v)
                for k, v in parse_qsl(parts.query, keep_blank_values=True)
            ],
            safe="*",
        )
        return urlunsplit(parts._replace(netloc=netloc, query=query))
    except ValueError:
        return "<a Postgres URL>"


def _has_input(conn: Any) -> bool:
    """Whether the server has sent something to an idle connection, without a round trip.

    An idle connection has nothing to read, unless the server said goodbye: after a restart,
    every pooled connection holds an error or end-of-file. (A notice sent while idle reads the
    same; the caller then checks the connection with a round trip.)
    """
    fd = conn.fileno()
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
        return bool(poller.poll(0))
    readable, _, failed = select.select([fd], [], [fd], 0)  # pragma: no cover - Windows
    return bool(readable or failed)


# -- the shared base: everything but the I/O ----------------------------------------------------


class _PostgresBase:
    """Options, SQL, encoding and decoding, and error mapping, shared by the two stores."""

    _pool_class: type[Any]

    def __init__(
        self,
        dsn: str | None,
        *,
        pool: Any,
        schema: str,
        ttl: float | None,
        max_messages: int | None,
        clock: Callable[[], float],
        min_size: int,
        max_size: int,
        timeout: float,
    ) -> None:
        check_retention(ttl, max_messages)
        self.schema = _check_schema(schema)
        self.timeout = _check_sizes(min_size, max_size, timeout)
        if (dsn is None) == (pool is None):
            raise ConfigurationError(
                "give exactly one of dsn= (a connection string) and pool= (a connection pool), "
                f"got {'both' if pool is not None else 'neither'}"
            )
        if pool is not None:
            if not isinstance(pool, self._pool_class):
                raise ConfigurationError(
                    f"pool must be a psycopg_pool.{self._pool_class.__name__}, "
                    f"got {type(pool).__name__}"
                )
            conninfo = pool.conninfo if isinstance(pool.conninfo, str) else ""
            self.dsn = redacted_dsn(conninfo) if conninfo else "<a pool>"
            self._conninfo: str | None = conninfo or None
            self._owns_pool = False
            self._pool = pool
        else:
            params = _check_dsn(dsn)
            assert dsn is not None
            self.dsn = redacted_dsn(dsn)
            self._conninfo = dsn
            self._owns_pool = True
            kwargs: dict[str, Any] = {"autocommit": True}
            # Bound every wait: a connection attempt, like a wait for a free connection.
            if "connect_timeout" not in params:
                kwargs["connect_timeout"] = max(2, math.ceil(self.timeout))
            if "application_name" not in params:
                kwargs["application_name"] = "zerda"
            self._pool = self._pool_class(
                dsn,
                min_size=min_size,
                max_size=max_size,
                timeout=self.timeout,
                kwargs=kwargs,
                open=False,
                name=f"zerda-{schema}",
                # A failed connection attempt is not retried in the background for minutes:
                # the next call that needs a connection tries again, so the first call after
                # the server comes back gets one.
                reconnect_timeout=0,
                reconnect_failed=self._connect_failed,
            )
        self.ttl = ttl
        self.max_messages = max_messages
        self._clock = clock
        self._sql = _Sql(self.schema)
        self._where = f"Postgres store {self.dsn} (schema {self.schema!r})"
        self._connect_failed_at = -math.inf  # when the pool last failed to connect (monotonic)
        self._ready = False  # the schema is known to be up to date
        self._opened = False  # our own pool has been opened
        self._closed = False
        self._decoded = DecodedMessages(_CACHE_SIZE)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dsn!r}, schema={self.schema!r})"

    # -- building statements (no I/O) ---------------------------------------------------------

    def _expires(self, now: float) -> float | None:
        return None if self.ttl is None else now + self.ttl

    def _append_query(
        self, session_id: str, messages: Sequence[Message], tokens: TokenCounts | None
    ) -> _Query:
        check_batch(messages, tokens)
        check_session_id(session_id)
        roles: list[str] = []
        users: list[int] = []
        opens: list[int] = []
        bodies: list[str | None] = []
        texts: list[str | None] = []
        n_users = n_opens = 0
        opened = False
        for m in messages:
            role = m.role
            if role is not _SYSTEM:
                if role is _USER:
                    n_users += 1
                if role is _USER or not opened:
                    n_opens += 1
                opened = True
            roles.append(role.value)
            users.append(n_users)
            opens.append(n_opens)
            body = m.to_json()
            if "\\u0000" in body:  # JSONB cannot hold a NUL character: keep the text
                bodies.append(None)
                texts.append(body)
            else:
                bodies.append(body)
                texts.append(None)
        now = self._clock()
        return _Query(
            self._sql.append,
            (
                session_id,
                now,
                self._expires(now),
                self.max_messages,
                roles,
                users,
                opens,
                bodies,
                texts,
                _encode_counts(tokens or {}, len(messages)),
            ),
            "append",
        )

    def _tail_query(self, session_id: str, turns: int | None, counter: str | None) -> _Query:
        check_session_id(session_id)
        if turns is not None:
            turns = max(0, min(turns, _MAX_TURNS))
        if counter is not None and (not isinstance(counter, str) or "\x00" in counter):
            raise ConfigurationError(f"a counter name is a string without NUL, got {counter!r}")
        params = {"session": session_id, "now": self._clock(), "turns": turns, "counter": counter}
        return _Query(self._sql.tail, params, "read a tail")

    def _tail_result(self, rows: Rows, session_id: str, counter: str | None) -> Tail:
        if not rows:
            return EMPTY_TAIL
        decode = self._decode
        system: list[Message] = []
        system_tokens: list[int | None] = []
        messages: list[Message] = []
        tokens: list[int | None] = []
        offsets: list[int] = []
        previous = SYSTEM_TURN
        for _, _, turn, body, count in rows:
            if turn is None:  # the session holds no message this read returns
                continue
            message = decode(body, session_id)
            if turn == SYSTEM_TURN:
                system.append(message)
                if counter is not None:
                    system_tokens.append(self._count(count, session_id))
                continue
            if turn != previous:
                offsets.append(len(messages))
                previous = turn
            messages.append(message)
            if counter is not None:
                tokens.append(self._count(count, session_id))
        total_messages, total_turns = rows[0][0], rows[0][1]
        return Tail(
            tuple(system), messages, offsets, total_turns, total_messages, tokens, system_tokens
        )

    def _history_query(self, session_id: str) -> _Query:
        check_session_id(session_id)
        params = {"session": session_id, "now": self._clock()}
        return _Query(self._sql.history, params, "read a history")

    def _history_result(self, rows: Rows, session_id: str) -> list[Message]:
        # A whole session would flush the cache of the tails that memories read again.
        return [self._decode(body, session_id, remember=False) for (body,) in rows]

    def _metadata_query(self, session_id: str) -> _Query:
        check_session_id(session_id)
        params = {"session": session_id, "now": self._clock()}
        return _Query(self._sql.metadata, params, "read metadata")

    def _metadata_result(self, rows: Rows, session_id: str) -> dict[str, Any]:
        if not rows:
            return {}
        text = rows[0][0]
        try:
            metadata = json.loads(text)
            if not isinstance(metadata, dict):
                raise TypeError(f"expected a JSON object, got {text[:60]!r}")
        except (ValueError, TypeError) as exc:
            raise CorruptDataError(
                f"{self._where}: the metadata of session {session_id!r} cannot be decoded: {exc}"
            ) from exc
        return metadata

    def _update_metadata_query(self, session_id: str, values: Mapping[str, Any]) -> _Query:
        copied = metadata_copy(values)
        check_session_id(session_id)
        kept = {k: v for k, v in copied.items() if v is not None}
        text = json.dumps(kept, ensure_ascii=False, separators=(",", ":"))
        if "\\u0000" in text:
            raise ConfigurationError(
                "session metadata stored in Postgres (JSONB) cannot hold NUL characters (\\u0000)"
            )
        dropped = [k for k, v in copied.items() if v is None]
        now = self._clock()
        return _Query(
            self._sql.update_metadata,
            (session_id, now, self._expires(now), text, dropped),
            "update metadata",
        )

    def _list_query(self) -> _Query:
        return _Query(self._sql.list, {"now": self._clock()}, "list sessions")

    @staticmethod
    def _list_result(rows: Rows) -> list[SessionInfo]:
        return [SessionInfo(*row) for row in rows]

    def _delete_query(self, session_id: str) -> _Query:
        check_session_id(session_id)
        return _Query(self._sql.delete, (session_id, self._clock()), "delete a session")

    def _clear_query(self) -> _Query:
        return _Query(self._sql.clear, None, "clear")

    def _purge_query(self) -> _Query:
        return _Query(self._sql.purge, (self._clock(),), "purge expired sessions")

    # -- migrating, as a flow of statements that either store drives ---------------------------

    def _schema_flow(self) -> Generator[_Query, Rows, tuple[int, int]]:
        """Bring the schema up to date; (version before, version after).

        Yields each statement to run and receives its rows; a store's driver runs them on one
        connection and rolls back if the flow raises. The common case (up to date) costs two
        reads and takes no lock.
        """
        known = [m.__name__ for m in MIGRATIONS]
        applied = yield from self._applied_flow()
        if applied == known:
            return len(known), len(known)
        yield _Query("BEGIN", None, "migrate the schema")
        yield _Query(_LOCK, (f"zerda.migrate:{self.schema}",), "lock the schema to migrate it")
        yield _Query(self._sql.create_schema, None, "create the schema")
        yield _Query(self._sql.create_migrations, None, "create the migrations table")
        applied = [name for (name,) in (yield _Query(self._sql.applied, None, "read versions"))]
        unknown = [name for name in applied if name not in known]
        if unknown:
            raise StoreUnavailableError(
                f"{self._where} has schema version {len(applied)}, newer than this Zerda "
                f"knows ({len(known)}; unknown migrations: {', '.join(unknown)}); "
                "upgrade zerda-memory to use it"
            )
        before = len(applied)
        for migration in MIGRATIONS:
            if migration.__name__ in applied:
                continue
            doing = f"apply migration {migration.__name__}"
            for statement in migration():
                yield _Query(self._sql.render(statement), None, doing)
            yield _Query(self._sql.record, (migration.__name__, time.time()), doing)
        yield _Query("COMMIT", None, "commit the migrations")
        return before, len(known)

    def _applied_flow(self) -> Generator[_Query, Rows, list[str]]:
        [(exists,)] = yield _Query(
            _HAS_MIGRATIONS_TABLE, (self._sql.migrations_table,), "read the schema version"
        )
        if not exists:
            return []
        rows = yield _Query(self._sql.applied, None, "read the schema version")
        return [name for (name,) in rows]

    # -- decoding -------------------------------------------------------------------------------

    def _decode(self, body: str, session_id: str, remember: bool = True) -> Message:
        return self._decoded.decode(body, self._where, session_id, remember)

    def _count(self, text: str | None, session_id: str) -> int | None:
        if text is None:
            return None
        try:
            count = int(text)
            if count < 0:
                raise ValueError(f"a negative count: {count}")
        except ValueError as exc:
            raise CorruptDataError(
                f"{self._where}: session {session_id!r} holds a token count that cannot be "
                f"decoded ({text[:60]!r}): {exc}"
            ) from None
        return count

    # -- errors ---------------------------------------------------------------------------------

    def _error(self, exc: BaseException, doing: str) -> ZerdaError:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        if isinstance(exc, UnicodeEncodeError):
            return ConfigurationError(
                f"{self._where}: cannot {doing}: the text is not valid Unicode ({reason})"
            )
        if isinstance(exc, psycopg.IntegrityError):
            return CorruptDataError(f"{self._where}: cannot {doing}: {reason}")
        if isinstance(
            exc,
            (pg_errors.UndefinedTable, pg_errors.UndefinedFunction, pg_errors.InvalidSchemaName),
        ):
            # Dropped under us: the next call creates the schema again.
            self._ready = False
            return StoreUnavailableError(
                f"{self._where}: cannot {doing}: the schema is missing or incomplete ({reason}); "
                "the next call creates it again"
            )
        return StoreUnavailableError(f"{self._where}: cannot {doing}: {reason}")

    # -- waiting for a connection --------------------------------------------------------------

    def _connect_failed(self, pool: Any) -> None:
        """The pool's callback when it gives up making a connection (at once: see above)."""
        self._connect_failed_at = time.monotonic()

    def _wait_slice(self, started: float) -> float:
        """How long to wait for a connection next; 0 when it is time to give up: the pool's
        timeout has run out, or its attempt to connect failed and no connection exists that
        another call could give back."""
        now = time.monotonic()
        left: float = started + self._pool.timeout - now
        if left <= 0:
            return 0.0
        if self._connect_failed_at >= started and self._pool.get_stats()["pool_size"] == 0:
            return 0.0
        return min(left, _WAIT_SLICE)

    def _no_connection(
        self, exc: BaseException, doing: str, cause: BaseException | None
    ) -> ZerdaError:
        """The error for a call that got no connection: why, when a direct try could tell."""
        if isinstance(exc, PoolClosed):
            return StoreUnavailableError(f"{self._where}: cannot {doing}: the pool is closed")
        if cause is not None:
            reason = " ".join(str(cause).split())
            return StoreUnavailableError(f"{self._where}: cannot {doing}: {reason}")
        return StoreUnavailableError(
            f"{self._where}: cannot {doing}: no free connection within "
            f"{self._pool.timeout:g} s (the pool holds at most {self._pool.max_size})"
        )

    def _closed_error(self) -> StoreUnavailableError:
        return StoreUnavailableError(f"{self._where} is closed")


def _encode_counts(given: TokenCounts, n: int) -> list[str | None]:
    """Each message's counts as a JSON object (``None`` when the batch has none)."""
    if not given:
        return [None] * n
    for name in given:
        if "\x00" in name:
            raise ConfigurationError(f"a counter name cannot hold NUL characters: {name!r}")
    items = list(given.items())
    if len(items) == 1:
        ((name, counts),) = items
        key = json.dumps(name, ensure_ascii=False)
        return [f"{{{key}:{c}}}" for c in counts]
    return [
        json.dumps({name: counts[i] for name, counts in items}, ensure_ascii=False)
        for i in range(n)
    ]


def split_schema(url: str) -> tuple[str, str | None]:
    """A Postgres URL without its ``schema=`` parameter (Zerda's, not libpq's), and its value."""
    parts = urlsplit(url)
    params = parse_qsl(parts.query, keep_blank_values=True)
    schemas = [v for k, v in params if k == "schema"]
    if len(schemas) > 1:
        raise ConfigurationError(f"{redacted_dsn(url)!r} gives schema= more than once")
    rest = urlencode([(k, v) for k, v in params if k != "schema"])
    return urlunsplit(parts._replace(query=rest)), (schemas[0] if schemas else None)


def open_postgres_url(url: str, **options: Any) -> PostgresStore:
    """A :class:`PostgresStore` for a ``postgresql://`` URL; ``?schema=NAME`` picks the
    schema (default ``zerda``), ``options`` go to the constructor."""
    dsn, schema = split_schema(url)
    if schema is not None:
        if "schema" in options:
            raise ConfigurationError("give the schema once: in the URL (?schema=) or as schema=")
        options["schema"] = schema
    return PostgresStore(dsn, **options)


# -- the sync store ---------------------------------------------------------------------------


class PostgresStore(_PostgresBase, ClosingStore):
    """Sessions in Postgres: any number of workers, processes and machines share them.

    Give either ``dsn`` (``postgresql://user@host/db`` or ``"host=... dbname=..."``: the store
    makes its own pool of ``min_size`` to ``max_size`` connections) or ``pool``, a
    :class:`psycopg_pool.ConnectionPool` you own (the store never closes it). Tables live in
    ``schema`` (created, and migrated, by the first call; ``zerda migrate`` does it ahead).

    Every call is one statement on an autocommit connection: one round trip. An append runs
    in a function that locks the session's row, so concurrent batches to one session queue
    there and get gap-free, unique positions; sessions do not wait for each other. A tail
    read is one query over two ranges of the primary key, whatever the session's length.
    ``ttl`` sets each written session's ``expires_at`` (updated_at + ttl; the TTL of the store
    that wrote last applies); ``purge_expired()`` deletes what has expired. ``max_messages``
    behaves as in :class:`~zerda.stores.InMemoryStore`.

    A server that cannot be reached raises :class:`~zerda.StoreUnavailableError` (naming the
    DSN without its password, psycopg's error chained) after at most ``timeout`` seconds; the
    store reconnects by itself once the server is back. A row that cannot be decoded raises
    :class:`~zerda.CorruptDataError`.
    """

    _pool_class = ConnectionPool

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: ConnectionPool[Any] | None = None,
        schema: str = "zerda",
        ttl: float | None = None,
        max_messages: int | None = None,
        clock: Callable[[], float] = time.time,
        min_size: int = 1,
        max_size: int = 10,
        timeout: float = 5.0,
    ) -> None:
        super().__init__(
            dsn,
            pool=pool,
            schema=schema,
            ttl=ttl,
            max_messages=max_messages,
            clock=clock,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout,
        )
        # One lock to open the pool, another to migrate (which needs a connection).
        self._open_lock = threading.Lock()
        self._schema_lock = threading.Lock()

    # -- connections ----------------------------------------------------------------------------

    @contextmanager
    def _connection(self, doing: str) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection in autocommit mode, known not to be left over from a server
        that has gone away; psycopg and pool errors become Zerda errors."""
        if self._closed:
            raise self._closed_error()
        pool = self._pool
        if self._owns_pool and not self._opened:
            with self._open_lock:
                if not self._opened:
                    pool.open()
                    self._opened = True
        conn = self._getconn(pool, doing)
        autocommit = conn.autocommit
        try:
            if not autocommit:
                conn.autocommit = True  # an idle connection: no round trip
            yield conn
        except psycopg.Error as exc:
            raise self._error(exc, doing) from exc
        except UnicodeEncodeError as exc:
            raise self._error(exc, doing) from exc
        finally:
            if not autocommit and not conn.closed:
                try:
                    conn.autocommit = False
                except psycopg.Error:
                    conn.close()
            pool.putconn(conn)

    def _getconn(self, pool: ConnectionPool[Any], doing: str) -> psycopg.Connection[Any]:
        started = time.monotonic()
        stale = 0
        while True:
            try:
                wait = self._wait_slice(started)
                if not wait:
                    raise PoolTimeout(f"no connection after {time.monotonic() - started:.2f} s")
                conn: psycopg.Connection[Any] = pool.getconn(timeout=wait)
            except PoolTimeout as exc:
                if self._wait_slice(started):
                    continue
                cause = self._probe()
                raise self._no_connection(exc, doing, cause) from (cause or exc)
            except psycopg.Error as exc:
                raise self._no_connection(exc, doing, None) from exc
            if not self._stale(conn):
                return conn
            # Left over from a server that has gone away: the pool replaces it. Each one is
            # found once, so this ends after at most one pass over the pool.
            conn.close()
            pool.putconn(conn)
            stale += 1
            if stale > pool.max_size:
                raise StoreUnavailableError(
                    f"{self._where}: cannot {doing}: every connection is broken"
                )

    @staticmethod
    def _stale(conn: psycopg.Connection[Any]) -> bool:
        if conn.closed or conn.broken:
            return True
        try:
            if not _has_input(conn):
                return False
            ConnectionPool.check_connection(conn)
        except (psycopg.Error, OSError, ValueError):
            return True
        return False

    def _probe(self) -> BaseException | None:
        """Connect once, outside the pool, to learn why the pool has no connection."""
        if self._conninfo is None:
            return None
        try:
            psycopg.connect(self._conninfo, connect_timeout=max(2, math.ceil(self.timeout))).close()
        except psycopg.Error as exc:
            return exc
        return None

    def _run(self, query: _Query) -> Rows:
        self._ensure_schema()
        with self._connection(query.doing) as conn:
            return _execute(conn, query)

    # -- the schema -----------------------------------------------------------------------------

    def _ensure_schema(self) -> None:
        if self._ready:
            return
        with self._schema_lock:
            if not self._ready:
                self._drive(self._schema_flow(), "prepare the schema")
                self._ready = True

    def _drive(self, flow: Generator[_Query, Rows, tuple[int, int]], doing: str) -> tuple[int, int]:
        with self._connection(doing) as conn:
            try:
                query = next(flow)
                while True:
                    try:
                        rows = _execute(conn, query)
                    except psycopg.Error as exc:
                        raise self._error(exc, query.doing) from exc
                    query = flow.send(rows)
            except StopIteration as stop:
                result: tuple[int, int] = stop.value
                return result
            except BaseException:
                if _in_transaction(conn):
                    with suppress(psycopg.Error):  # the first error is the one to report
                        conn.rollback()
                raise

    def schema_version(self) -> int:
        """How many schema migrations the schema has had (creating or migrating it first)."""
        self._ensure_schema()
        return len(MIGRATIONS)

    def migrate(self) -> tuple[int, int]:
        """Bring the schema up to date now; its versions (before, after).

        The first call of any other method does the same; this is ``zerda migrate``'s way to
        do it ahead, and to say what it did.
        """
        with self._schema_lock:
            versions = self._drive(self._schema_flow(), "migrate the schema")
            self._ready = True
        return versions

    # -- the contract ---------------------------------------------------------------------------

    def append(
        self, session_id: str, messages: Sequence[Message], tokens: TokenCounts | None = None
    ) -> None:
        self._run(self._append_query(session_id, messages, tokens))

    def tail(self, session_id: str, turns: int | None, counter: str | None = None) -> Tail:
        rows = self._run(self._tail_query(session_id, turns, counter))
        return self._tail_result(rows, session_id, counter)

    def history(self, session_id: str) -> list[Message]:
        return self._history_result(self._run(self._history_query(session_id)), session_id)

    def get_metadata(self, session_id: str) -> dict[str, Any]:
        return self._metadata_result(self._run(self._metadata_query(session_id)), session_id)

    def update_metadata(self, session_id: str, values: Mapping[str, Any]) -> None:
        self._run(self._update_metadata_query(session_id, values))

    def list_sessions(self) -> list[SessionInfo]:
        return self._list_result(self._run(self._list_query()))

    def delete_session(self, session_id: str) -> bool:
        [(existed,)] = self._run(self._delete_query(session_id))
        return bool(existed)

    def clear(self) -> None:
        self._run(self._clear_query())

    def purge_expired(self) -> int:
        [(count,)] = self._run(self._purge_query())
        return int(count)

    def close(self) -> None:
        """Close the store (and its pool, if it made it); later calls raise. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_pool and self._opened:
            self._pool.close()


def _in_transaction(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    status = conn.info.transaction_status
    return not conn.closed and status in (
        psycopg.pq.TransactionStatus.INTRANS,
        psycopg.pq.TransactionStatus.INERROR,
    )


def _execute(conn: psycopg.Connection[Any], query: _Query) -> Rows:
    cursor = conn.cursor(row_factory=tuple_row)
    cursor.execute(query.text, query.params)
    return cursor.fetchall() if cursor.description is not None else []


# -- the async store --------------------------------------------------------------------------


class AsyncPostgresStore(_PostgresBase, AsyncClosingStore):
    """The async protocol over Postgres, on psycopg's async connections: no thread, no block.

    The same options, SQL and behaviour as :class:`PostgresStore`; ``pool`` is a
    :class:`psycopg_pool.AsyncConnectionPool`. The store's own pool opens on the first call,
    in the running event loop (use the store from that loop only). Close it with
    ``await store.aclose()`` or ``async with``.

    It has no sync methods on purpose: a memory over it uses its async methods natively, and
    its sync methods say to use the async ones.
    """

    _pool_class = AsyncConnectionPool

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: AsyncConnectionPool[Any] | None = None,
        schema: str = "zerda",
        ttl: float | None = None,
        max_messages: int | None = None,
        clock: Callable[[], float] = time.time,
        min_size: int = 1,
        max_size: int = 10,
        timeout: float = 5.0,
    ) -> None:
        super().__init__(
            dsn,
            pool=pool,
            schema=schema,
            ttl=ttl,
            max_messages=max_messages,
            clock=clock,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout,
        )
        self._open_lock = asyncio.Lock()
        self._schema_lock = asyncio.Lock()

    # -- connections ----------------------------------------------------------------------------

    @asynccontextmanager
    async def _connection(self, doing: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        if self._closed:
            raise self._closed_error()
        pool = self._pool
        if self._owns_pool and not self._opened:
            async with self._open_lock:
                if not self._opened:
                    await pool.open()
                    self._opened = True
        conn = await self._getconn(pool, doing)
        autocommit = conn.autocommit
        try:
            if not autocommit:
                await conn.set_autocommit(True)
            yield conn
        except psycopg.Error as exc:
            raise self._error(exc, doing) from exc
        except UnicodeEncodeError as exc:
            raise self._error(exc, doing) from exc
        finally:
            if not autocommit and not conn.closed:
                try:
                    await conn.set_autocommit(False)
                except psycopg.Error:
                    await conn.close()
            await pool.putconn(conn)

    async def _getconn(
        self, pool: AsyncConnectionPool[Any], doing: str
    ) -> psycopg.AsyncConnection[Any]:
        started = time.monotonic()
        stale = 0
        while True:
            try:
                wait = self._wait_slice(started)
                if not wait:
                    raise PoolTimeout(f"no connection after {time.monotonic() - started:.2f} s")
                conn: psycopg.AsyncConnection[Any] = await pool.getconn(timeout=wait)
            except PoolTimeout as exc:
                if self._wait_slice(started):
                    continue
                cause = await self._probe()
                raise self._no_connection(exc, doing, cause) from (cause or exc)
            except psycopg.Error as exc:
                raise self._no_connection(exc, doing, None) from exc
            if not await self._stale(conn):
                return conn
            await conn.close()
            await pool.putconn(conn)
            stale += 1
            if stale > pool.max_size:
                raise StoreUnavailableError(
                    f"{self._where}: cannot {doing}: every connection is broken"
                )

    @staticmethod
    async def _stale(conn: psycopg.AsyncConnection[Any]) -> bool:
        if conn.closed or conn.broken:
            return True
        try:
            if not _has_input(conn):
                return False
            await AsyncConnectionPool.check_connection(conn)
        except (psycopg.Error, OSError, ValueError):
            return True
        return False

    async def _probe(self) -> BaseException | None:
        if self._conninfo is None:
            return None
        try:
            conn = await psycopg.AsyncConnection.connect(
                self._conninfo, connect_timeout=max(2, math.ceil(self.timeout))
            )
        except psycopg.Error as exc:
            return exc
        await conn.close()
        return None

    async def _run(self, query: _Query) -> Rows:
        await self._ensure_schema()
        async with self._connection(query.doing) as conn:
            return await _aexecute(conn, query)

    # -- the schema -----------------------------------------------------------------------------

    async def _ensure_schema(self) -> None:
        if self._ready:
            return
        async with self._schema_lock:
            if not self._ready:
                await self._drive(self._schema_flow(), "prepare the schema")
                self._ready = True

    async def _drive(
        self, flow: Generator[_Query, Rows, tuple[int, int]], doing: str
    ) -> tuple[int, int]:
        async with self._connection(doing) as conn:
            try:
                query = next(flow)
                while True:
                    try:
                        rows = await _aexecute(conn, query)
                    except psycopg.Error as exc:
                        raise self._error(exc, query.doing) from exc
                    query = flow.send(rows)
            except StopIteration as stop:
                result: tuple[int, int] = stop.value
                return result
            except BaseException:
                if _in_transaction(conn):
                    with suppress(psycopg.Error):  # the first error is the one to report
                        await conn.rollback()
                raise

    async def aschema_version(self) -> int:
        """How many schema migrations the schema has had (creating or migrating it first)."""
        await self._ensure_schema()
        return len(MIGRATIONS)

    async def amigrate(self) -> tuple[int, int]:
        """Bring the schema up to date now; its versions (before, after)."""
        async with self._schema_lock:
            versions = await self._drive(self._schema_flow(), "migrate the schema")
            self._ready = True
        return versions

    # -- the contract ---------------------------------------------------------------------------

    async def aappend(
        self, session_id: str, messages: Sequence[Message], tokens: TokenCounts | None = None
    ) -> None:
        await self._run(self._append_query(session_id, messages, tokens))

    async def atail(self, session_id: str, turns: int | None, counter: str | None = None) -> Tail:
        rows = await self._run(self._tail_query(session_id, turns, counter))
        return self._tail_result(rows, session_id, counter)

    async def ahistory(self, session_id: str) -> list[Message]:
        rows = await self._run(self._history_query(session_id))
        return self._history_result(rows, session_id)

    async def aget_metadata(self, session_id: str) -> dict[str, Any]:
        rows = await self._run(self._metadata_query(session_id))
        return self._metadata_result(rows, session_id)

    async def aupdate_metadata(self, session_id: str, values: Mapping[str, Any]) -> None:
        await self._run(self._update_metadata_query(session_id, values))

    async def alist_sessions(self) -> list[SessionInfo]:
        return self._list_result(await self._run(self._list_query()))

    async def adelete_session(self, session_id: str) -> bool:
        [(existed,)] = await self._run(self._delete_query(session_id))
        return bool(existed)

    async def aclear(self) -> None:
        await self._run(self._clear_query())

    async def apurge_expired(self) -> int:
        [(count,)] = await self._run(self._purge_query())
        return int(count)

    async def aclose(self) -> None:
        """Close the store (and its pool, if it made it); later calls raise. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_pool and self._opened:
            await self._pool.close()


async def _aexecute(conn: psycopg.AsyncConnection[Any], query: _Query) -> Rows:
    cursor = conn.cursor(row_factory=tuple_row)
    await cursor.execute(query.text, query.params)
    return await cursor.fetchall() if cursor.description is not None else []

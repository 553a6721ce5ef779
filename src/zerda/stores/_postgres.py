"""The Postgres store: sessions shared by many workers, on psycopg 3 and psycopg_pool."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import math
import os
import re
import select
import socket
import threading
import time
from collections.abc import Callable, Collection, Generator, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from zerda.errors import (
    ConfigurationError,
    CorruptDataError,
    StoreUnavailableError,
    ZerdaError,
)
from zerda.messages import Message
from zerda.parts import Part
from zerda.stores._base import (
    AsyncClosingStore,
    ClosingStore,
    DecodedMessages,
    SessionInfo,
    Tail,
    TokenCounts,
    canonical_json,
    check_batch,
    check_ids,
    check_retention,
    check_session_id,
    check_timeout,
    decode_metadata,
    edited,
    empty_tail,
    message_not_found,
    metadata_copy,
    redact,
    session_exists,
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

_T = TypeVar("_T")

# System messages belong to no turn; they are stored under this turn number, so that they sort
# before every turn of their session and read as one short range of the primary key.
SYSTEM_TURN = -1
# A tail's first row (turn -2 in zerda_tail) carries the session's totals and metadata;
# append_then_tail puts one more row before it (turn -3) saying how many messages it stored.
# Postgres truncates longer identifiers silently; refuse them instead.
_MAX_SCHEMA_LENGTH = 63
_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A ``turns`` argument beyond this is "all of them" (and stays inside bigint).
_MAX_TURNS = 2**62
# A call waiting for a connection looks up this often whether the pool's attempt to make one
# has failed, so that it fails then rather than when its time runs out.
_WAIT_SLICE = 0.1
# The client gives a statement this much longer than the server's statement_timeout, so that a
# slow statement on a live server is cancelled by the server (the connection stays usable)
# before the client gives up on the connection.
_GRACE = 0.25

Rows = list[tuple[Any, ...]]


# -- schema migrations ------------------------------------------------------------------------
#
# Ordered, named functions, each applied once and recorded by name in the schema's
# ``_zerda_migrations`` table. A migration returns SQL statements (templates where ``{schema}``
# is the store's schema, quoted by psycopg.sql.Identifier, and braces are doubled), so that the
# sync and the async store run the very same ones. Add a migration by appending a function;
# never edit or reorder one that has shipped.

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


@_migration
def m003_ids_exact_json_and_compare_and_set() -> list[str]:
    # - Message ids: a column, unique per session where set. An append skips the messages
    #   whose id its session holds, in the same statement, under the session's lock.
    # - Exact JSON: new messages keep their JSON text (body_text; JSONB turned 1e16 into an
    #   int); rows written before keep reading as they were. Session metadata moves to one row
    #   per key holding its value's JSON text; the values JSONB held stay in ``legacy`` until
    #   written again. ``key`` is the key as a JSON string (NUL characters and all).
    # - compare_and_set compares ``cmp``: the value as canonical JSON with integral floats
    #   written as ints (NULL when that is ``value`` itself), so that two values have the same
    #   text exactly when they are equal JSON values; a legacy value compares as JSONB.
    # - Reads: zerda_tail returns the tail and the metadata in one statement (an inlined SQL
    #   function); zerda_append_then_tail appends and returns the tail under one lock.
    return [
        """
        CREATE TABLE {schema}.metadata (
            sid bigint NOT NULL,
            key text COLLATE "C" NOT NULL,
            value text,
            cmp text,
            legacy jsonb,
            PRIMARY KEY (sid, key),
            CHECK ((value IS NULL) <> (legacy IS NULL))
        )
        """,
        """
        INSERT INTO {schema}.metadata (sid, key, legacy)
            SELECT s.sid, to_json(e.key)::text, e.value
            FROM {schema}.sessions s CROSS JOIN LATERAL jsonb_each(s.metadata) e
        """,
        # Old clients refuse a schema newer than they know; the functions they would call go.
        """
        DROP FUNCTION {schema}.zerda_update_metadata(
            text, double precision, double precision, jsonb, text[])
        """,
        """
        DROP FUNCTION {schema}.zerda_append(text, double precision, double precision, bigint,
            text[], bigint[], bigint[], text[], text[], text[])
        """,
        "ALTER TABLE {schema}.sessions DROP COLUMN metadata",
        "ALTER TABLE {schema}.messages ADD COLUMN id text",
        "CREATE UNIQUE INDEX messages_id ON {schema}.messages (sid, id) WHERE id IS NOT NULL",
        """
        CREATE OR REPLACE FUNCTION {schema}.zerda_writable(p_session text, p_now double precision)
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
                DELETE FROM {schema}.metadata WHERE sid = s.sid;
                UPDATE {schema}.sessions SET created_at = p_now, updated_at = p_now,
                        expires_at = NULL, next_seq = 0, first_seq = 0,
                        next_turn = 0, first_turn = 0, system_trimmed = 0
                    WHERE sid = s.sid
                    RETURNING * INTO s;
            END IF;
            RETURN s;
        END
        $$
        """,
        # The batch less the messages whose id the session holds, numbered as stored: a turn
        # starts at each user message, and at the first non-system message of a session that
        # has no turn yet. Returns how many messages it stored.
        """
        CREATE FUNCTION {schema}.zerda_append(
            p_session text, p_now double precision, p_expires double precision,
            p_keep bigint, p_roles text[], p_ids text[], p_bodies text[], p_tokens text[]
        ) RETURNS bigint LANGUAGE plpgsql
        -- Generic plans: planning the batch statement costs more than running it, and its
        -- plan never depends on the values.
        SET plan_cache_mode = force_generic_plan AS $$
        DECLARE
            s {schema}.sessions;
            v_stored bigint;
            v_last_turn bigint;
            v_next_seq bigint;
            v_cut_turn bigint;
            v_cut_seq bigint;
        BEGIN
            s := {schema}.zerda_writable(p_session, p_now);
            WITH batch AS (
                -- One probe of the ids index per message (a LATERAL with LIMIT: never a scan
                -- of every id the session holds, whatever the planner thinks of its size).
                SELECT b.role, b.id, b.body, b.tokens, b.i
                FROM unnest(p_roles, p_ids, p_bodies, p_tokens)
                    WITH ORDINALITY AS b(role, id, body, tokens, i)
                LEFT JOIN LATERAL (
                    SELECT true AS held FROM {schema}.messages m
                    WHERE m.sid = s.sid AND m.id = b.id LIMIT 1
                ) h ON true
                WHERE h.held IS NULL
            ), numbered AS (
                SELECT batch.*, row_number() OVER w AS n,
                       count(*) FILTER (WHERE role = 'user') OVER w AS users
                FROM batch WINDOW w AS (ORDER BY i)
            ), added AS (
                INSERT INTO {schema}.messages (sid, turn, seq, role, id, body_text, tokens)
                SELECT s.sid,
                       CASE WHEN role = 'system' THEN -1
                            ELSE s.next_turn - 1 + users + CASE
                                WHEN s.next_turn = 0 AND (
                                    SELECT role FROM batch WHERE role <> 'system'
                                    ORDER BY i LIMIT 1) <> 'user' THEN 1
                                ELSE 0 END
                       END,
                       s.next_seq + n - 1, role, id, body, tokens::jsonb
                FROM numbered
                RETURNING turn
            )
            SELECT count(*), max(turn) INTO v_stored, v_last_turn FROM added;
            v_next_seq := s.next_seq + v_stored;
            s.next_turn := greatest(s.next_turn, coalesce(v_last_turn, -1) + 1);
            IF p_keep IS NOT NULL AND v_next_seq - s.first_seq > p_keep THEN
                -- Keep at least p_keep messages by whole turns: the cut is the turn of the
                -- newest non-system message at or before the limit (that turn starts at or
                -- before it, and every later turn after it). The dropped messages take their
                -- ids with them; system messages are pinned, and keep theirs.
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
                    SELECT count(*) INTO s.system_trimmed FROM {schema}.messages
                        WHERE sid = s.sid AND turn = -1 AND seq < v_cut_seq;
                END IF;
            END IF;
            UPDATE {schema}.sessions SET updated_at = p_now, expires_at = p_expires,
                    next_seq = v_next_seq, next_turn = s.next_turn, first_seq = s.first_seq,
                    first_turn = s.first_turn, system_trimmed = s.system_trimmed
                WHERE sid = s.sid;
            RETURN v_stored;
        END
        $$
        """,
        # The session row (totals, and where the asked-for turns start), then its system
        # messages and the newest turns: two ranges of the primary key. A live session gives a
        # first row (turn -2) with its totals and its metadata as one JSON object (NULL: none).
        """
        CREATE FUNCTION {schema}.zerda_tail(
            p_session text, p_now double precision, p_turns bigint, p_counter text
        ) RETURNS TABLE (
            turn bigint, body text, count text, total_messages bigint, total_turns bigint
        ) LANGUAGE sql STABLE AS $$
            WITH s AS (
                SELECT sid, next_seq - first_seq + system_trimmed AS total_messages,
                       next_turn - first_turn AS total_turns,
                       CASE WHEN p_turns IS NULL THEN first_turn
                            ELSE greatest(next_turn - p_turns, first_turn) END AS from_turn
                FROM {schema}.sessions
                WHERE session_id = p_session AND (expires_at IS NULL OR expires_at > p_now)
            )
            SELECT t.turn, t.body, t.count, t.total_messages, t.total_turns
            FROM s CROSS JOIN LATERAL (
                SELECT -2::bigint AS turn, -1::bigint AS seq,
                       (SELECT '{{' || string_agg(d.key || ':' || coalesce(d.value, d.legacy::text),
                                                  ',' ORDER BY d.key) || '}}'
                        FROM {schema}.metadata d WHERE d.sid = s.sid) AS body,
                       NULL::text AS count, s.total_messages, s.total_turns
                UNION ALL
                SELECT m.turn, m.seq, coalesce(m.body::text, m.body_text),
                       (m.tokens -> p_counter)::text, NULL, NULL
                FROM {schema}.messages m WHERE m.sid = s.sid AND m.turn = -1
                UNION ALL
                SELECT m.turn, m.seq, coalesce(m.body::text, m.body_text),
                       (m.tokens -> p_counter)::text, NULL, NULL
                FROM {schema}.messages m WHERE m.sid = s.sid AND m.turn >= s.from_turn
            ) t
            ORDER BY t.turn, t.seq
        $$
        """,
        # Under the lock the append took, so the tail is the session right after the append.
        """
        CREATE FUNCTION {schema}.zerda_append_then_tail(
            p_session text, p_now double precision, p_expires double precision,
            p_keep bigint, p_roles text[], p_ids text[], p_bodies text[], p_tokens text[],
            p_turns bigint, p_counter text
        ) RETURNS TABLE (
            turn bigint, body text, count text, total_messages bigint, total_turns bigint
        ) LANGUAGE plpgsql AS $$
        DECLARE
            v_stored bigint;
        BEGIN
            v_stored := {schema}.zerda_append(p_session, p_now, p_expires, p_keep, p_roles,
                                              p_ids, p_bodies, p_tokens);
            RETURN QUERY SELECT -3::bigint, NULL::text, v_stored::text, NULL::bigint,
                                NULL::bigint;
            RETURN QUERY SELECT * FROM {schema}.zerda_tail(p_session, p_now, p_turns, p_counter);
        END
        $$
        """,
        """
        CREATE FUNCTION {schema}.zerda_update_metadata(
            p_session text, p_now double precision, p_expires double precision,
            p_keys text[], p_values text[], p_cmps text[]
        ) RETURNS void LANGUAGE plpgsql AS $$
        DECLARE
            s {schema}.sessions;
        BEGIN
            s := {schema}.zerda_writable(p_session, p_now);
            DELETE FROM {schema}.metadata d USING unnest(p_keys, p_values) AS u(key, value)
                WHERE d.sid = s.sid AND d.key = u.key AND u.value IS NULL;
            INSERT INTO {schema}.metadata AS d (sid, key, value, cmp)
                SELECT s.sid, u.key, u.value, u.cmp
                FROM unnest(p_keys, p_values, p_cmps) AS u(key, value, cmp)
                WHERE u.value IS NOT NULL
                ON CONFLICT (sid, key) DO UPDATE
                    SET value = excluded.value, cmp = excluded.cmp, legacy = NULL;
            UPDATE {schema}.sessions SET updated_at = p_now, expires_at = p_expires
                WHERE sid = s.sid;
        END
        $$
        """,
        # Whether metadata ``p_key`` of session ``p_sid`` holds the value whose comparison text
        # is ``p_expected`` (NULL: whether it is absent).
        """
        CREATE FUNCTION {schema}.zerda_holds(p_sid bigint, p_key text, p_expected text)
        RETURNS boolean LANGUAGE plpgsql AS $$
        DECLARE
            v_cmp text;
            v_legacy jsonb;
        BEGIN
            SELECT coalesce(d.cmp, d.value), d.legacy INTO v_cmp, v_legacy
                FROM {schema}.metadata d WHERE d.sid = p_sid AND d.key = p_key;
            IF NOT FOUND THEN
                RETURN p_expected IS NULL;
            ELSIF p_expected IS NULL THEN
                RETURN false;
            ELSIF v_legacy IS NULL THEN
                RETURN v_cmp = p_expected;
            END IF;
            BEGIN
                RETURN v_legacy = p_expected::jsonb;
            EXCEPTION WHEN untranslatable_character THEN
                RETURN false;  -- a NUL character: no JSONB value holds one
            END;
        END
        $$
        """,
        # Locks the session first, so that the comparison and the write are one step. A failed
        # comparison writes nothing (and creates no session).
        """
        CREATE FUNCTION {schema}.zerda_compare_and_set(
            p_session text, p_now double precision, p_expires double precision,
            p_key text, p_expected text, p_value text, p_cmp text
        ) RETURNS boolean LANGUAGE plpgsql AS $$
        DECLARE
            s {schema}.sessions;
        BEGIN
            SELECT * INTO s FROM {schema}.sessions WHERE session_id = p_session FOR UPDATE;
            IF FOUND AND (s.expires_at IS NULL OR s.expires_at > p_now) THEN
                IF NOT {schema}.zerda_holds(s.sid, p_key, p_expected) THEN
                    RETURN false;
                END IF;
            ELSIF p_expected IS NOT NULL THEN
                RETURN false;  -- no live session: every key is absent
            ELSE
                -- Creates the session, starts an expired one afresh, or waits for another
                -- writer that is creating it (and then compares what that one wrote).
                s := {schema}.zerda_writable(p_session, p_now);
                IF NOT {schema}.zerda_holds(s.sid, p_key, p_expected) THEN
                    RETURN false;
                END IF;
            END IF;
            IF p_value IS NULL THEN
                DELETE FROM {schema}.metadata d WHERE d.sid = s.sid AND d.key = p_key;
            ELSE
                INSERT INTO {schema}.metadata AS d (sid, key, value, cmp)
                    VALUES (s.sid, p_key, p_value, p_cmp)
                    ON CONFLICT (sid, key) DO UPDATE
                        SET value = excluded.value, cmp = excluded.cmp, legacy = NULL;
            END IF;
            UPDATE {schema}.sessions SET updated_at = p_now, expires_at = p_expires
                WHERE sid = s.sid;
            RETURN true;
        END
        $$
        """,
        """
        CREATE OR REPLACE FUNCTION {schema}.zerda_delete(p_session text, p_now double precision)
        RETURNS boolean LANGUAGE plpgsql AS $$
        DECLARE
            s {schema}.sessions;
        BEGIN
            SELECT * INTO s FROM {schema}.sessions WHERE session_id = p_session FOR UPDATE;
            IF NOT FOUND THEN
                RETURN false;
            END IF;
            DELETE FROM {schema}.messages WHERE sid = s.sid;
            DELETE FROM {schema}.metadata WHERE sid = s.sid;
            DELETE FROM {schema}.sessions WHERE sid = s.sid;
            RETURN s.expires_at IS NULL OR s.expires_at > p_now;
        END
        $$
        """,
        """
        CREATE OR REPLACE FUNCTION {schema}.zerda_purge(p_now double precision)
        RETURNS bigint LANGUAGE plpgsql AS $$
        DECLARE
            v_sids bigint[];
        BEGIN
            WITH gone AS (
                DELETE FROM {schema}.sessions WHERE expires_at <= p_now RETURNING sid
            )
            SELECT array_agg(sid) INTO v_sids FROM gone;
            DELETE FROM {schema}.messages WHERE sid = ANY (v_sids);
            DELETE FROM {schema}.metadata WHERE sid = ANY (v_sids);
            RETURN coalesce(cardinality(v_sids), 0);
        END
        $$
        """,
    ]


@_migration
def m004_developer_messages_are_pinned() -> list[str]:
    # Messages of the developer role are pinned like system messages: stored at turn -1, in
    # no turn. zerda_append as migration 3 made it, with that one change.
    (append,) = [
        statement
        for statement in m003_ids_exact_json_and_compare_and_set()
        if "CREATE FUNCTION {schema}.zerda_append(" in statement
    ]
    return [
        append.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
        .replace("role = 'system'", "role IN ('system', 'developer')")
        .replace("role <> 'system'", "role NOT IN ('system', 'developer')")
    ]


@_migration
def m005_editing_the_log() -> list[str]:
    # Editing the log (issue #16): delete messages, pop the newest turn, fork a session, edit a
    # message. Each is one function call (one transaction) that first takes the session row's
    # lock, as an append does, so that edits and appends to one session queue there and seq
    # and turn numbers never interleave.
    #
    # An edit leaves the session as InMemoryStore's rebuild does: the log holds every message,
    # positions first_seq .. next_seq - 1 without a gap, and turns are numbered again from what
    # is left (a turn starts at each user message, and at the first non-pinned message when no
    # turn has started before it). The pinned messages that retention kept before the log
    # (system_trimmed of them, at positions below first_seq) move to just before it and join
    # it (zerda_untrim), as the reference's rebuild makes them part of its log; only the
    # messages after the first one deleted are renumbered (zerda_rewrite), so that deleting
    # near the end, or popping the newest turn, moves next to nothing.
    return [
        # The live session's row, locked; NULL when there is no live session (an expired one
        # reads as absent): edits never create a session.
        """
        CREATE FUNCTION {schema}.zerda_locked(p_session text, p_now double precision)
        RETURNS {schema}.sessions LANGUAGE plpgsql AS $$
        DECLARE
            s {schema}.sessions;
        BEGIN
            SELECT * INTO s FROM {schema}.sessions WHERE session_id = p_session FOR UPDATE;
            IF FOUND AND (s.expires_at IS NULL OR s.expires_at > p_now) THEN
                RETURN s;
            END IF;
            RETURN NULL;
        END
        $$
        """,
        # The messages of session p_sid at positions p_from .. p_to (NULL: to the end), with
        # their rank n among them (1, 2, ...) and their turn numbered again: pinned messages
        # -1; the others continue turn p_turn (the turn going on before p_from), or, when
        # none is (NULL), open turn p_first_turn at the first of them.
        """
        CREATE FUNCTION {schema}.zerda_numbered(
            p_sid bigint, p_from bigint, p_to bigint, p_turn bigint, p_first_turn bigint
        ) RETURNS TABLE (seq bigint, n bigint, turn bigint) LANGUAGE sql STABLE AS $$
            SELECT x.seq, row_number() OVER w,
                   CASE WHEN x.pinned THEN -1
                        ELSE coalesce(p_turn, p_first_turn - 1)
                             + count(*) FILTER (WHERE x.opens) OVER w
                   END
            FROM (
                SELECT m.seq, m.role IN ('system', 'developer') AS pinned,
                       m.role = 'user' OR (
                           p_turn IS NULL AND m.role NOT IN ('system', 'developer')
                           AND count(*) FILTER (WHERE m.role NOT IN ('system', 'developer'))
                               OVER (ORDER BY m.seq) = 1
                       ) AS opens
                FROM {schema}.messages m
                WHERE m.sid = p_sid AND m.seq >= p_from AND (p_to IS NULL OR m.seq <= p_to)
            ) x
            WINDOW w AS (ORDER BY x.seq)
        $$
        """,
        # Moving rows: seq is unique per session, and checked row by row, so rows first go to
        # their new place negated (-1 - seq: no row has a negative position), then all turn
        # positive in a second statement; no row ever takes a position another still holds.
        #
        # zerda_untrim: the pinned messages before first_seq (those retention kept) move to
        # the positions just before it, in order; returns the new first_seq.
        """
        CREATE FUNCTION {schema}.zerda_untrim(
            p_sid bigint, p_first_seq bigint, p_trimmed bigint
        ) RETURNS bigint LANGUAGE plpgsql AS $$
        DECLARE
            v_moved bigint;
        BEGIN
            IF p_trimmed = 0 THEN
                RETURN p_first_seq;
            END IF;
            UPDATE {schema}.messages m SET seq = r.k - r.n - p_first_seq
                FROM (
                    SELECT x.seq, row_number() OVER (ORDER BY x.seq) AS n, count(*) OVER () AS k
                    FROM {schema}.messages x
                    WHERE x.sid = p_sid AND x.seq >= 0 AND x.seq < p_first_seq
                ) r
                WHERE m.sid = p_sid AND m.seq = r.seq;
            GET DIAGNOSTICS v_moved = ROW_COUNT;
            UPDATE {schema}.messages m SET seq = -1 - m.seq WHERE m.sid = p_sid AND m.seq < 0;
            RETURN p_first_seq - v_moved;
        END
        $$
        """,
        # After an edit: the messages from position p_from on (all of them after the first
        # one deleted) take the positions from p_from on and their turns again, and the
        # session row says so, as a write (updated_at, expires_at). A session left without a
        # turn numbers its turns from 0 again (zerda_append opens the first turn then).
        """
        CREATE FUNCTION {schema}.zerda_rewrite(
            p_sid bigint, p_first_seq bigint, p_first_turn bigint, p_from bigint,
            p_now double precision, p_expires double precision
        ) RETURNS void LANGUAGE plpgsql AS $$
        DECLARE
            v_turn bigint;
            v_after bigint;
            v_last bigint;
        BEGIN
            SELECT m.turn INTO v_turn FROM {schema}.messages m
                WHERE m.sid = p_sid AND m.seq < p_from AND m.turn >= 0
                ORDER BY m.seq DESC LIMIT 1;
            UPDATE {schema}.messages m SET seq = -p_from - r.n, turn = r.turn
                FROM {schema}.zerda_numbered(p_sid, p_from, NULL, v_turn, p_first_turn) r
                WHERE m.sid = p_sid AND m.seq = r.seq;
            GET DIAGNOSTICS v_after = ROW_COUNT;
            UPDATE {schema}.messages m SET seq = -1 - m.seq WHERE m.sid = p_sid AND m.seq < 0;
            SELECT max(m.turn) INTO v_last FROM {schema}.messages m WHERE m.sid = p_sid;
            UPDATE {schema}.sessions
                SET updated_at = p_now, expires_at = p_expires, first_seq = p_first_seq,
                    next_seq = p_from + v_after, system_trimmed = 0,
                    first_turn = CASE WHEN v_last >= 0 THEN p_first_turn ELSE 0 END,
                    next_turn = CASE WHEN v_last >= 0 THEN v_last + 1 ELSE 0 END
                WHERE sid = p_sid;
        END
        $$
        """,
        # How many messages it deleted; deleting none writes nothing.
        """
        CREATE FUNCTION {schema}.zerda_delete_messages(
            p_session text, p_now double precision, p_expires double precision, p_ids text[]
        ) RETURNS bigint LANGUAGE plpgsql AS $$
        DECLARE
            s {schema}.sessions;
            v_first_seq bigint;
            v_deleted bigint;
            v_from bigint;
        BEGIN
            s := {schema}.zerda_locked(p_session, p_now);
            IF s.sid IS NULL OR NOT EXISTS (
                SELECT 1 FROM {schema}.messages m WHERE m.sid = s.sid AND m.id = ANY (p_ids)
            ) THEN
                RETURN 0;
            END IF;
            v_first_seq := {schema}.zerda_untrim(s.sid, s.first_seq, s.system_trimmed);
            WITH gone AS (
                DELETE FROM {schema}.messages m WHERE m.sid = s.sid AND m.id = ANY (p_ids)
                RETURNING m.seq
            )
            SELECT count(*), min(gone.seq) INTO v_deleted, v_from FROM gone;
            PERFORM {schema}.zerda_rewrite(s.sid, v_first_seq, s.first_turn, v_from, p_now,
                                           p_expires);
            RETURN v_deleted;
        END
        $$
        """,
        # The newest turn's messages (JSON texts, in order), deleted; the pinned messages
        # among them stay (they belong to no turn). No turn: an empty array, nothing written.
        """
        CREATE FUNCTION {schema}.zerda_pop_turn(
            p_session text, p_now double precision, p_expires double precision
        ) RETURNS text[] LANGUAGE plpgsql AS $$
        DECLARE
            s {schema}.sessions;
            v_first_seq bigint;
            v_from bigint;
            v_bodies text[];
        BEGIN
            s := {schema}.zerda_locked(p_session, p_now);
            IF s.sid IS NULL OR s.next_turn <= s.first_turn THEN
                RETURN '{{}}';
            END IF;
            v_first_seq := {schema}.zerda_untrim(s.sid, s.first_seq, s.system_trimmed);
            WITH gone AS (
                DELETE FROM {schema}.messages m
                    WHERE m.sid = s.sid AND m.turn = s.next_turn - 1
                    RETURNING m.seq, coalesce(m.body::text, m.body_text) AS body
            )
            SELECT array_agg(gone.body ORDER BY gone.seq), min(gone.seq)
                INTO v_bodies, v_from FROM gone;
            PERFORM {schema}.zerda_rewrite(s.sid, v_first_seq, s.first_turn,
                                           coalesce(v_from, s.next_seq), p_now, p_expires);
            RETURN coalesce(v_bodies, '{{}}');
        END
        $$
        """,
        # Replace the body of message p_id if it still is p_expected (the text the caller
        # read and edited), dropping its token counts. 1: done; 2: the message changed since
        # it was read (read it again); 0: no such message in a live session.
        """
        CREATE FUNCTION {schema}.zerda_edit_message(
            p_session text, p_now double precision, p_expires double precision,
            p_id text, p_expected text, p_body text
        ) RETURNS integer LANGUAGE plpgsql AS $$
        DECLARE
            s {schema}.sessions;
        BEGIN
            s := {schema}.zerda_locked(p_session, p_now);
            IF s.sid IS NULL THEN
                RETURN 0;
            END IF;
            UPDATE {schema}.messages m SET body = NULL, body_text = p_body, tokens = NULL
                WHERE m.sid = s.sid AND m.id = p_id
                    AND coalesce(m.body::text, m.body_text) = p_expected;
            IF NOT FOUND THEN
                RETURN CASE WHEN EXISTS (
                    SELECT 1 FROM {schema}.messages m WHERE m.sid = s.sid AND m.id = p_id
                ) THEN 2 ELSE 0 END;
            END IF;
            PERFORM {schema}.zerda_rewrite(
                s.sid, {schema}.zerda_untrim(s.sid, s.first_seq, s.system_trimmed),
                s.first_turn, s.next_seq, p_now, p_expires);
            RETURN 1;
        END
        $$
        """,
        # Copy the source's messages up to p_at (NULL: all; an INSERT ... SELECT of those rows,
        # numbered from 0) and its metadata into p_target, created (or started afresh) at
        # p_now. How many messages it copied; -1: no message p_at in the source; -2: the
        # target holds messages or metadata. A source that is not there (at p_at NULL) copies
        # nothing and creates nothing. Both session rows are locked, in session_id order, so
        # that two forks between the same two sessions, opposite ways, queue rather than
        # deadlock; the source's lock keeps appends out while its rows are copied.
        """
        CREATE FUNCTION {schema}.zerda_fork(
            p_source text, p_target text, p_now double precision, p_expires double precision,
            p_at text
        ) RETURNS bigint LANGUAGE plpgsql AS $$
        DECLARE
            src {schema}.sessions;
            t {schema}.sessions;
            v_end bigint;
            v_copied bigint;
            v_last bigint;
        BEGIN
            PERFORM 1 FROM {schema}.sessions WHERE session_id IN (p_source, p_target)
                ORDER BY session_id FOR UPDATE;
            src := {schema}.zerda_locked(p_source, p_now);
            IF p_at IS NOT NULL THEN
                SELECT m.seq INTO v_end FROM {schema}.messages m
                    WHERE m.sid = src.sid AND m.id = p_at;
                IF v_end IS NULL THEN
                    RETURN -1;
                END IF;
            END IF;
            SELECT * INTO t FROM {schema}.sessions WHERE session_id = p_target;
            IF FOUND AND (t.expires_at IS NULL OR t.expires_at > p_now) AND (
                t.next_seq - t.first_seq + t.system_trimmed > 0
                OR EXISTS (SELECT 1 FROM {schema}.metadata d WHERE d.sid = t.sid)
            ) THEN
                RETURN -2;
            END IF;
            IF src.sid IS NULL THEN
                RETURN 0;
            END IF;
            -- Creates the target, starts an expired one afresh, or waits for another writer
            -- creating it (and then finds what that one wrote).
            t := {schema}.zerda_writable(p_target, p_now);
            IF t.next_seq - t.first_seq + t.system_trimmed > 0
                OR EXISTS (SELECT 1 FROM {schema}.metadata d WHERE d.sid = t.sid) THEN
                RETURN -2;
            END IF;
            INSERT INTO {schema}.messages (sid, turn, seq, role, id, body, body_text, tokens)
                SELECT t.sid, r.turn, r.n - 1, m.role, m.id, m.body, m.body_text, m.tokens
                FROM {schema}.zerda_numbered(src.sid, 0, v_end, NULL, 0) r
                JOIN {schema}.messages m ON m.sid = src.sid AND m.seq = r.seq;
            GET DIAGNOSTICS v_copied = ROW_COUNT;
            INSERT INTO {schema}.metadata (sid, key, value, cmp, legacy)
                SELECT t.sid, d.key, d.value, d.cmp, d.legacy
                FROM {schema}.metadata d WHERE d.sid = src.sid;
            SELECT max(m.turn) INTO v_last FROM {schema}.messages m WHERE m.sid = t.sid;
            UPDATE {schema}.sessions
                SET created_at = p_now, updated_at = p_now, expires_at = p_expires,
                    next_seq = v_copied, first_seq = 0, next_turn = coalesce(v_last, -1) + 1,
                    first_turn = 0, system_trimmed = 0
                WHERE sid = t.sid;
            RETURN v_copied;
        END
        $$
        """,
    ]


# -- SQL (templates; each store renders them once for its schema) ------------------------------

# The arrays go in binary: psycopg's text format would escape every quote of every JSON body
# (a regular expression callback per quote: the largest cost of an append on the client).
_BATCH = "%b::text[], %b::text[], %b::text[], %b::text[]"
_APPEND = "SELECT {schema}.zerda_append(%s, %s, %s::float8, %s::bigint, " + _BATCH + ")"
_TAIL_COLUMNS = "turn, body, count, total_messages, total_turns"
TAIL_QUERY = f"SELECT {_TAIL_COLUMNS} FROM {{schema}}.zerda_tail(%s, %s, %s::bigint, %s::text)"
_APPEND_THEN_TAIL = (
    f"SELECT {_TAIL_COLUMNS} FROM {{schema}}.zerda_append_then_tail(%s, %s, %s::float8, "
    f"%s::bigint, {_BATCH}, %s::bigint, %s::text)"
)
_LIVE = "(expires_at IS NULL OR expires_at > %(now)s)"
_HISTORY = (
    "SELECT coalesce(m.body::text, m.body_text) FROM {schema}.sessions s"
    " JOIN {schema}.messages m ON m.sid = s.sid"
    " WHERE s.session_id = %(session)s AND (s.expires_at IS NULL OR s.expires_at > %(now)s)"
    " ORDER BY m.seq"
)
_METADATA = (
    "SELECT (SELECT '{{' || string_agg(d.key || ':' || coalesce(d.value, d.legacy::text), ','"
    " ORDER BY d.key) || '}}' FROM {schema}.metadata d WHERE d.sid = s.sid)"
    " FROM {schema}.sessions s WHERE s.session_id = %(session)s AND " + _LIVE
)
_UPDATE_METADATA = (
    "SELECT {schema}.zerda_update_metadata(%s, %s, %s::float8, %s::text[], %s::text[], %s::text[])"
)
_COMPARE_AND_SET = (
    "SELECT {schema}.zerda_compare_and_set(%s, %s, %s::float8, %s, %s::text, %s::text, %s::text)"
)
_LIST = (
    "SELECT session_id, next_seq - first_seq + system_trimmed, next_turn - first_turn,"
    " created_at, updated_at, expires_at FROM {schema}.sessions WHERE "
    + _LIVE
    + " ORDER BY session_id"
)
_DELETE = "SELECT {schema}.zerda_delete(%s, %s)"
_CLEAR = "TRUNCATE {schema}.messages, {schema}.metadata, {schema}.sessions"
_PURGE = "SELECT {schema}.zerda_purge(%s)"
_DELETE_MESSAGES = "SELECT {schema}.zerda_delete_messages(%s, %s, %s::float8, %s::text[])"
_POP_TURN = "SELECT {schema}.zerda_pop_turn(%s, %s, %s::float8)"
_FORK = "SELECT {schema}.zerda_fork(%s, %s, %s, %s::float8, %s::text)"
_MESSAGE = (
    "SELECT coalesce(m.body::text, m.body_text) FROM {schema}.sessions s"
    " JOIN {schema}.messages m ON m.sid = s.sid"
    " WHERE s.session_id = %(session)s AND (s.expires_at IS NULL OR s.expires_at > %(now)s)"
    " AND m.id = %(id)s"
)
_EDIT_MESSAGE = "SELECT {schema}.zerda_edit_message(%s, %s, %s::float8, %s, %s, %s)"

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
    # Applying migrations on purpose (migrate()): no deadline, no statement timeout.
    unbounded: bool = False


class _Sql:
    """The statements of one store, rendered for its schema."""

    def __init__(self, schema: str) -> None:
        self._schema = sql.Identifier(schema)
        render = self.render
        self.append = render(_APPEND)
        self.append_then_tail = render(_APPEND_THEN_TAIL)
        self.tail = render(TAIL_QUERY)
        self.history = render(_HISTORY)
        self.metadata = render(_METADATA)
        self.update_metadata = render(_UPDATE_METADATA)
        self.compare_and_set = render(_COMPARE_AND_SET)
        self.list = render(_LIST)
        self.delete = render(_DELETE)
        self.clear = render(_CLEAR)
        self.purge = render(_PURGE)
        self.delete_messages = render(_DELETE_MESSAGES)
        self.pop_turn = render(_POP_TURN)
        self.fork = render(_FORK)
        self.message = render(_MESSAGE)
        self.edit_message = render(_EDIT_MESSAGE)
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
    """The parameters of a connection string; ConfigurationError (without its password) if it
    cannot be parsed, or names a port that is not one."""
    if not isinstance(dsn, str) or not dsn.strip():
        shown = redact(dsn) if isinstance(dsn, str) else dsn
        raise ConfigurationError(
            f"dsn must be a connection string (postgresql://user@host/db or 'host=... "
            f"dbname=...'), got {shown!r}"
        )
    try:
        params: dict[str, Any] = conninfo_to_dict(dsn)
    except (psycopg.Error, ValueError) as exc:
        raise ConfigurationError(
            f"dsn {redact(dsn)!r} is not a valid connection string: {redact(str(exc))}"
        ) from None
    for port in str(params.get("port") or "").split(","):
        if port and not (port.isdecimal() and 0 < int(port) < 65536):
            raise ConfigurationError(
                f"dsn {redact(dsn)!r} names port {port!r}; a port is a number from 1 to 65535"
            )
    return params


def _check_sizes(min_size: int, max_size: int, timeout: float) -> float:
    for name, value in (("min_size", min_size), ("max_size", max_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigurationError(f"{name} must be an integer >= 0, got {value!r}")
    if max_size < max(1, min_size):
        raise ConfigurationError(
            f"max_size must be >= 1 and >= min_size ({min_size}), got {max_size}"
        )
    return check_timeout(timeout)


def _connection_options(params: Mapping[str, Any], timeout: float) -> dict[str, Any]:
    """What the store adds to a DSN for the connections of its own pool: autocommit, a name,
    and bounds on every wait: connecting (connect_timeout; libpq's minimum is 2 s) and each
    statement (statement_timeout, sent with the connection request: no round trip)."""
    kwargs: dict[str, Any] = {"autocommit": True}
    if "connect_timeout" not in params:
        kwargs["connect_timeout"] = max(2, math.ceil(timeout))
    if "application_name" not in params:
        kwargs["application_name"] = "zerda"
    options = str(params.get("options") or "")
    if "statement_timeout" not in options:
        milliseconds = max(1, round(timeout * 1000))
        kwargs["options"] = f"{options} -c statement_timeout={milliseconds}".strip()
    return kwargs


# ``key = value`` pairs of a libpq key/value string, the value maybe quoted.
_KEY_VALUE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*('(?:[^'\\]|\\.)*'|[^\s']*)")


def split_schema(dsn: str) -> tuple[str, str | None]:
    """A connection string without its ``schema`` parameter (Zerda's, not libpq's), and its
    value: ``?schema=NAME`` in a URL, ``schema=NAME`` in a key/value string."""
    try:
        if "://" not in dsn:
            return _split_key_value_schema(dsn)
        parts = urlsplit(dsn)
        params = parse_qsl(parts.query, keep_blank_values=True)
        schemas = [v for k, v in params if k == "schema"]
        rest = urlencode([(k, v) for k, v in params if k != "schema"])
        url = urlunsplit(parts._replace(query=rest)) if schemas else dsn
    except ValueError as exc:
        raise ConfigurationError(
            f"{redact(dsn)!r} is not a valid Postgres URL: {redact(str(exc))}"
        ) from None
    if len(schemas) > 1:
        raise ConfigurationError(f"{redact(dsn)!r} gives schema= more than once")
    return url, (schemas[0] if schemas else None)


def _split_key_value_schema(dsn: str) -> tuple[str, str | None]:
    pairs: list[tuple[str, str]] = []
    at = 0
    while at < len(dsn.rstrip()):
        match = _KEY_VALUE.match(dsn, at)
        if match is None or match.end() == at:
            return dsn, None  # not for us to parse: libpq says what is wrong with it
        pairs.append((match.group(1), match.group(2)))
        at = match.end()
    schemas = [v.strip("'") for k, v in pairs if k == "schema"]
    if not schemas:
        return dsn, None
    if len(schemas) > 1:
        raise ConfigurationError(f"{redact(dsn)!r} gives schema= more than once")
    return " ".join(f"{k}={v}" for k, v in pairs if k != "schema"), schemas[0]


def open_postgres_url(url: str, **options: Any) -> PostgresStore:
    """A :class:`PostgresStore` for a ``postgresql://`` URL or a libpq key/value string;
    ``schema=NAME`` in it (``?schema=NAME`` in a URL) picks the schema (default ``zerda``),
    ``options`` go to the constructor."""
    return PostgresStore(_schema_option(url, options), **options)


def open_async_postgres_url(url: str, **options: Any) -> AsyncPostgresStore:
    """The :class:`AsyncPostgresStore` of the same ``url`` as :func:`open_postgres_url`
    takes."""
    return AsyncPostgresStore(_schema_option(url, options), **options)


def _schema_option(url: str, options: dict[str, Any]) -> str:
    """``url`` without its ``schema=NAME``, which goes into ``options``."""
    dsn, schema = split_schema(url)
    if schema is not None:
        if "schema" in options:
            raise ConfigurationError("give the schema once: in the URL (?schema=) or as schema=")
        options["schema"] = schema
    return dsn


# -- encoding ---------------------------------------------------------------------------------


def _key_text(key: str) -> str:
    """A metadata key as stored: a JSON string (what Postgres's to_json gives too)."""
    return json.dumps(key, ensure_ascii=False)


def _value_texts(value: Any) -> tuple[str, str | None]:
    """A metadata value's JSON text, and its comparison text when that differs."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    comparable = _comparable(value)
    return text, (None if comparable == text else comparable)


def _comparable(value: Any) -> str:
    """The text compare_and_set compares: canonical JSON with integral floats written as
    ints, so that two values get the same text exactly when :func:`same_json` holds (the float
    1e16 and the int 10**16 are equal; 1e23 is not 10**23, nor ``true`` 1)."""
    return canonical_json(_ints(value))


def _ints(value: Any) -> Any:
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return value


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


def _in_transaction(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    status = conn.info.transaction_status
    return not conn.closed and status in (
        psycopg.pq.TransactionStatus.INTRANS,
        psycopg.pq.TransactionStatus.INERROR,
    )


# -- deadlines ----------------------------------------------------------------------------------
#
# libpq has no read timeout: a call on a connection whose server has stopped answering (frozen,
# or a network that drops packets) waits for ever. The server's statement_timeout covers a slow
# statement on a live server; for a server that sends nothing at all, the client shuts the
# connection's socket down at the call's deadline: libpq then sees the connection end, psycopg
# raises, and the connection, broken, never goes back to the pool in use. A sync store has one
# watchdog thread for that; an async store a timer on its event loop. (Cancelling the awaiting
# task instead would not do: psycopg then asks the frozen server to cancel, waiting 5 s and 5 s
# more before it gives up.)


def _shut_down(fd: int) -> None:
    """Shut down the socket behind ``fd`` both ways, leaving ``fd`` open."""
    if fd < 0:
        return
    with suppress(OSError):
        sock = socket.socket(fileno=fd)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.detach()


class _Alarm:
    """One armed deadline of the watchdog."""

    __slots__ = ("armed", "fd", "fired")

    def __init__(self, fd: int) -> None:
        self.fd = fd  # a duplicate of the connection's socket, ours to close
        self.armed = True
        self.fired = False


class _Watchdog:
    """A daemon thread that shuts down the socket of every call that overruns its deadline.

    Arming costs a lock, a heap push and a dup(); the thread wakes only for the earliest
    deadline still armed, so a process making calls one after another wakes it about once per
    timeout. The socket is shut down through a duplicate of its file descriptor, taken when
    the deadline is armed: even if libpq closed its own descriptor meanwhile (and the number
    went to another socket), the shutdown can only reach the connection it was meant for.
    """

    def __init__(self) -> None:
        self._start()

    def _start(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._heap: list[tuple[float, int, _Alarm]] = []
        self._order = itertools.count()
        self._wakes_at = math.inf
        self._thread: threading.Thread | None = None

    def arm(self, deadline: float, fd: int) -> _Alarm:
        try:
            duplicate = os.dup(fd)
        except OSError:  # pragma: no cover - a Windows socket handle: no client-side deadline
            duplicate = -1
        alarm = _Alarm(duplicate)
        with self._lock:
            heapq.heappush(self._heap, (deadline, next(self._order), alarm))
            if deadline < self._wakes_at:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._watch, name="zerda-postgres-watchdog", daemon=True
                    )
                    self._thread.start()
                self._changed.notify()
        return alarm

    def disarm(self, alarm: _Alarm) -> bool:
        """Forget ``alarm``; whether it fired (the connection's socket is shut down)."""
        with self._lock:
            alarm.armed = False
            heap = self._heap
            while heap and not heap[0][2].armed:
                heapq.heappop(heap)
        if alarm.fd >= 0:
            os.close(alarm.fd)
        return alarm.fired

    def _watch(self) -> None:
        with self._lock:
            while True:
                heap, now = self._heap, time.monotonic()
                while heap and (not heap[0][2].armed or heap[0][0] <= now):
                    _, _, alarm = heapq.heappop(heap)
                    if alarm.armed:
                        alarm.armed, alarm.fired = False, True
                        _shut_down(alarm.fd)
                self._wakes_at = heap[0][0] if heap else math.inf
                self._changed.wait(self._wakes_at - now if heap else None)


_WATCHDOG = _Watchdog()
if hasattr(os, "register_at_fork"):  # a forked child has no watchdog thread: it starts anew
    os.register_at_fork(after_in_child=_WATCHDOG._start)


def _shut_down_async(conn: psycopg.AsyncConnection[Any], fired: list[bool]) -> None:
    """The async store's deadline (a timer on the loop, which also runs psycopg: the
    connection cannot be closed under it)."""
    if not conn.closed and not conn.broken:
        fired.append(True)
        _shut_down(conn.fileno())


class _TimedOut(Exception):
    """A call ran out of time; ``sent``: a statement went out (its connection is done)."""

    def __init__(self, sent: bool) -> None:
        super().__init__("timed out")
        self.sent = sent


# -- a call, as a flow of requests that either store's driver performs ---------------------------
#
# Everything a call does that is not I/O — when to wait for a connection and for how long, what
# to do with a stale one, which statements to run, how each failure reads — is written once, as
# a generator of requests. The sync and the async store each drive it: they perform each
# request, send its result back, or throw its exception in.


@dataclass(slots=True)
class _Lease:
    """A pooled connection, held by one call until its deadline."""

    conn: Any
    deadline: float
    autocommit: bool  # the connection's own setting, restored when it goes back
    broken: bool = False  # closed on its way back: it timed out, or its state is unknown


class _Get(NamedTuple):
    """A connection from the pool within ``wait`` seconds (``None`` if none came)."""

    wait: float
    deadline: float


class _Run(NamedTuple):
    """Run ``query`` on the lease's connection; its rows."""

    lease: _Lease
    query: _Query


class _Put(NamedTuple):
    """Give the connection back (closed first if broken)."""

    lease: _Lease


class _Probe(NamedTuple):
    """Connect once outside the pool, within ``wait`` seconds; the error, if any."""

    wait: float


_Request = _Get | _Run | _Put | _Probe
_Flow = Generator[_Request, Any, _T]
_Statements = Generator[_Query, Rows, _T]
"""What a call runs: it yields statements and receives their rows."""

_CHECK = _Query("", None, "check a connection")


# -- the shared base: everything but the I/O ----------------------------------------------------


class _PostgresBase:
    """Options, SQL, encoding and decoding, the flow of a call and its errors, shared by the
    two stores."""

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
            self.dsn = redact(conninfo) if conninfo else "<a pool>"
            self._conninfo: str | None = conninfo or None
            self._owns_pool = False
            self._pool = pool
        else:
            params = _check_dsn(dsn)
            assert dsn is not None
            self.dsn = redact(dsn)
            self._conninfo = dsn
            self._owns_pool = True
            self._pool = self._pool_class(
                dsn,
                min_size=min_size,
                max_size=max_size,
                timeout=self.timeout,
                kwargs=_connection_options(params, self.timeout),
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
        self._decoded = DecodedMessages()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dsn!r}, schema={self.schema!r})"

    # -- statements (no I/O) --------------------------------------------------------------------

    def _expires(self, now: float) -> float | None:
        return None if self.ttl is None else now + self.ttl

    def _batch(
        self, session_id: str, messages: Sequence[Message], tokens: TokenCounts | None
    ) -> tuple[list[Any], list[str]]:
        """The parameters of an append, and the messages' JSON texts."""
        check_batch(messages, tokens)
        check_session_id(session_id)
        bodies = [m.to_json() for m in messages]
        now = self._clock()
        params = [
            session_id,
            now,
            self._expires(now),
            self.max_messages,
            [m.role.value for m in messages],
            [m.id for m in messages],
            bodies,
            _encode_counts(tokens or {}, len(messages)),
        ]
        return params, bodies

    def _append(
        self, session_id: str, messages: Sequence[Message], tokens: TokenCounts | None
    ) -> _Statements[int]:
        params, bodies = self._batch(session_id, messages, tokens)
        [(stored,)] = yield _Query(self._sql.append, params, "append")
        # What was written reads back as the same text: the next tail finds it decoded.
        self._decoded.add(bodies, messages)
        return int(stored)

    def _append_then_tail(
        self,
        session_id: str,
        messages: Sequence[Message],
        tokens: TokenCounts | None,
        turns: int | None,
        counter: str | None,
    ) -> _Statements[tuple[int, Tail]]:
        params, bodies = self._batch(session_id, messages, tokens)
        params += [_check_turns(turns), _check_counter(counter)]
        rows = yield _Query(self._sql.append_then_tail, params, "append and read a tail")
        self._decoded.add(bodies, messages)
        stored = int(rows[0][2])
        return stored, self._tail_result(rows, 1, session_id, counter)

    def _tail(self, session_id: str, turns: int | None, counter: str | None) -> _Statements[Tail]:
        check_session_id(session_id)
        params = (session_id, self._clock(), _check_turns(turns), _check_counter(counter))
        rows = yield _Query(self._sql.tail, params, "read a tail")
        return self._tail_result(rows, 0, session_id, counter)

    def _tail_result(self, rows: Rows, first: int, session_id: str, counter: str | None) -> Tail:
        """The tail in ``rows[first:]``: a header row (totals and metadata), then the system
        messages (turn -1) and the turns asked for, in order; nothing for a missing session."""
        if len(rows) <= first:
            return empty_tail()
        _, metadata_text, _, total_messages, total_turns = rows[first]
        metadata = (
            {} if metadata_text is None else decode_metadata(metadata_text, self._where, session_id)
        )
        decode = self._decode
        system: list[Message] = []
        system_tokens: list[int | None] = []
        messages: list[Message] = []
        tokens: list[int | None] = []
        offsets: list[int] = []
        previous = SYSTEM_TURN
        for turn, body, count, _, _ in itertools.islice(rows, first + 1, None):
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
        return Tail(
            tuple(system),
            messages,
            offsets,
            total_turns,
            total_messages,
            tokens,
            system_tokens,
            metadata,
        )

    def _history(self, session_id: str) -> _Statements[list[Message]]:
        check_session_id(session_id)
        params = {"session": session_id, "now": self._clock()}
        rows = yield _Query(self._sql.history, params, "read a history")
        # A whole session would flush the cache of the tails that memories read again.
        return [self._decode(body, session_id, remember=False) for (body,) in rows]

    def _get_metadata(self, session_id: str) -> _Statements[dict[str, Any]]:
        check_session_id(session_id)
        params = {"session": session_id, "now": self._clock()}
        rows = yield _Query(self._sql.metadata, params, "read metadata")
        if not rows or rows[0][0] is None:
            return {}
        return decode_metadata(rows[0][0], self._where, session_id)

    def _update_metadata(self, session_id: str, values: Mapping[str, Any]) -> _Statements[None]:
        copied = metadata_copy(values)
        check_session_id(session_id)
        keys: list[str] = []
        texts: list[str | None] = []
        comparables: list[str | None] = []
        for key, value in copied.items():
            keys.append(_key_text(key))
            text, comparable = (None, None) if value is None else _value_texts(value)
            texts.append(text)
            comparables.append(comparable)
        now = self._clock()
        params = (session_id, now, self._expires(now), keys, texts, comparables)
        yield _Query(self._sql.update_metadata, params, "update metadata")

    def _compare_and_set(
        self, session_id: str, key: str, expected: Any, value: Any
    ) -> _Statements[bool]:
        copied = metadata_copy({key: value}, reserved=True)
        wanted = metadata_copy({key: expected}, reserved=True)[key]
        check_session_id(session_id)
        text, comparable = (None, None) if copied[key] is None else _value_texts(copied[key])
        now = self._clock()
        params = (
            session_id,
            now,
            self._expires(now),
            _key_text(key),
            None if wanted is None else _comparable(wanted),
            text,
            comparable,
        )
        [(done,)] = yield _Query(self._sql.compare_and_set, params, "compare and set metadata")
        return bool(done)

    def _list_sessions(self) -> _Statements[list[SessionInfo]]:
        rows = yield _Query(self._sql.list, {"now": self._clock()}, "list sessions")
        return [SessionInfo(*row) for row in rows]

    def _delete_session(self, session_id: str) -> _Statements[bool]:
        check_session_id(session_id)
        params = (session_id, self._clock())
        [(existed,)] = yield _Query(self._sql.delete, params, "delete a session")
        return bool(existed)

    def _clear(self) -> _Statements[None]:
        yield _Query(self._sql.clear, None, "clear")

    def _purge_expired(self) -> _Statements[int]:
        [(count,)] = yield _Query(self._sql.purge, (self._clock(),), "purge expired sessions")
        return int(count)

    # -- editing the log: each one function call, under the session row's lock ------------------

    def _delete_messages(self, session_id: str, ids: Collection[str]) -> _Statements[int]:
        wanted = check_ids(ids)
        check_session_id(session_id)
        now = self._clock()
        # An id that is not printable text can never be held (Message refuses it), and some
        # (a NUL character) cannot be sent: they match nothing, as everywhere.
        params = (session_id, now, self._expires(now), [i for i in wanted if _may_be_held(i)])
        [(deleted,)] = yield _Query(self._sql.delete_messages, params, "delete messages")
        return int(deleted)

    def _pop_turn(self, session_id: str) -> _Statements[list[Message]]:
        check_session_id(session_id)
        now = self._clock()
        params = (session_id, now, self._expires(now))
        [(bodies,)] = yield _Query(self._sql.pop_turn, params, "pop a turn")
        return [self._decode(body, session_id, remember=False) for body in bodies or ()]

    def _fork(self, session_id: str, new_session_id: str, at: str | None) -> _Statements[int]:
        check_session_id(new_session_id)
        check_session_id(session_id)
        if at is not None and not _may_be_held(at):
            raise message_not_found(session_id, at)
        now = self._clock()
        params = (session_id, new_session_id, now, self._expires(now), at)
        [(copied,)] = yield _Query(self._sql.fork, params, "fork a session")
        if copied == -1:
            raise message_not_found(session_id, str(at))
        if copied == -2:
            raise session_exists(new_session_id)
        return int(copied)

    def _edit_message(
        self, session_id: str, message_id: str, content: str | tuple[Part, ...] | None
    ) -> _Statements[Message]:
        """Two statements, neither holding a lock while the client works: read the message,
        then store its edit if the message still reads the same (under the session's lock,
        with the session's bookkeeping); if it changed meanwhile, edit it again."""
        check_session_id(session_id)
        if not _may_be_held(message_id):
            raise message_not_found(session_id, message_id)
        while True:
            now = self._clock()
            params: Mapping[str, Any] = {"session": session_id, "now": now, "id": message_id}
            rows = yield _Query(self._sql.message, params, "read a message")
            if not rows:
                raise message_not_found(session_id, message_id)
            [(old,)] = rows
            new = edited(self._decode(old, session_id, remember=False), content, now)
            body = new.to_json()
            edit = (session_id, now, self._expires(now), message_id, old, body)
            [(outcome,)] = yield _Query(self._sql.edit_message, edit, "edit a message")
            if outcome == 1:
                self._decoded.add([body], [new])
                return new
            if outcome == 0:
                raise message_not_found(session_id, message_id)

    # -- migrating ------------------------------------------------------------------------------

    def _schema_flow(self, on_purpose: bool = False) -> _Statements[tuple[int, int]]:
        """Bring the schema up to date; (version before, version after).

        The common case (up to date) costs two reads and takes no lock. Migrations run in one
        transaction; applied by migrate() (``on_purpose``) they run without a time limit, since
        one may rewrite a large table; applied by the first call of a store, within its
        timeout like everything it does.
        """
        known = [m.__name__ for m in MIGRATIONS]
        applied = yield from self._applied_flow()
        if applied == known:
            return len(known), len(known)
        yield _Query("BEGIN", None, "migrate the schema")
        if on_purpose:
            yield _Query("SET LOCAL statement_timeout = 0", None, "migrate the schema")
        doing = "lock the schema to migrate it"
        yield _Query(_LOCK, (f"zerda.migrate:{self.schema}",), doing, on_purpose)
        yield _Query(self._sql.create_schema, None, "create the schema", on_purpose)
        yield _Query(self._sql.create_migrations, None, "create the migrations table", on_purpose)
        rows = yield _Query(self._sql.applied, None, "read versions", on_purpose)
        applied = [name for (name,) in rows]
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
                yield _Query(self._sql.render(statement), None, doing, on_purpose)
            yield _Query(self._sql.record, (migration.__name__, time.time()), doing, on_purpose)
        yield _Query("COMMIT", None, "commit the migrations", on_purpose)
        return before, len(known)

    def _applied_flow(self) -> _Statements[list[str]]:
        [(exists,)] = yield _Query(
            _HAS_MIGRATIONS_TABLE, (self._sql.migrations_table,), "read the schema version"
        )
        if not exists:
            return []
        rows = yield _Query(self._sql.applied, None, "read the schema version")
        return [name for (name,) in rows]

    # -- a call: a connection, its statements, its errors ----------------------------------------

    def _connected(self, statements: _Statements[_T], query: _Query, deadline: float) -> _Flow[_T]:
        """Run ``statements``, whose first statement is ``query``, on one pooled connection
        within ``deadline``. (The caller takes that first statement out before any I/O, so
        that bad arguments are refused whether the server answers or not.)"""
        lease = yield from self._checkout(query.doing, deadline)
        try:
            while True:
                try:
                    rows = yield _Run(lease, query)
                except _TimedOut as exc:
                    lease.broken = lease.broken or exc.sent
                    raise self._timed_out(query) from TimeoutError(
                        f"no answer within {self.timeout:g} s"
                    )
                except (psycopg.Error, UnicodeEncodeError) as exc:
                    raise self._error(exc, query) from exc
                query = statements.send(rows)
        except StopIteration as stop:
            result: _T = stop.value
            return result
        except BaseException:
            # A transaction left open (a migration that failed) never goes back to the pool:
            # closing the connection rolls it back, without waiting for the server.
            if not lease.broken and _in_transaction(lease.conn):
                lease.broken = True
            raise
        finally:
            yield _Put(lease)

    def _checkout(self, doing: str, deadline: float) -> _Flow[_Lease]:
        """A connection from the pool, known not to be left over from a server that has gone
        away, or the reason there is none."""
        started = time.monotonic()
        stale = 0
        while True:
            wait = self._wait_slice(started, deadline)
            if not wait:
                cause = yield _Probe(deadline - time.monotonic())
                raise self._no_connection(doing, cause) from cause
            try:
                lease: _Lease | None = yield _Get(wait, deadline)
            except PoolClosed:
                raise StoreUnavailableError(
                    f"{self._where}: cannot {doing}: the pool is closed"
                ) from None
            except psycopg.Error as exc:
                reason = redact(" ".join(str(exc).split()))
                raise StoreUnavailableError(f"{self._where}: cannot {doing}: {reason}") from exc
            if lease is None:
                continue
            conn = lease.conn
            if conn.closed or conn.broken:
                lease.broken = True
            elif not _has_input(conn):
                return lease
            else:
                # The server has said something to an idle connection: most likely goodbye (it
                # restarted). Ask it once; a stale connection goes, the pool makes a new one.
                try:
                    yield _Run(lease, _CHECK)
                except (psycopg.Error, OSError, _TimedOut):
                    lease.broken = True
                if not lease.broken:
                    return lease
            yield _Put(lease)
            stale += 1
            if stale > self._pool.max_size:
                raise StoreUnavailableError(
                    f"{self._where}: cannot {doing}: every connection is broken"
                )

    def _wait_slice(self, started: float, deadline: float) -> float:
        """How long to wait for a connection next; 0 when it is time to give up: the call's
        time has run out, or the pool's attempt to connect failed and no connection exists
        that another call could give back."""
        left = deadline - time.monotonic()
        if left <= 0:
            return 0.0
        if self._connect_failed_at >= started and self._pool.get_stats()["pool_size"] == 0:
            return 0.0
        return min(left, _WAIT_SLICE)

    def _connect_failed(self, pool: Any) -> None:
        """The pool's callback when it gives up making a connection (at once: see above)."""
        self._connect_failed_at = time.monotonic()

    # -- errors ---------------------------------------------------------------------------------

    def _error(self, exc: BaseException, query: _Query) -> ZerdaError:
        reason = redact(" ".join(str(exc).split()) or type(exc).__name__)
        doing = query.doing
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
        if isinstance(exc, pg_errors.QueryCanceled) and doing.startswith("apply migration"):
            reason += _MIGRATE_HINT
        return StoreUnavailableError(f"{self._where}: cannot {doing}: {reason}")

    def _timed_out(self, query: _Query) -> StoreUnavailableError:
        hint = _MIGRATE_HINT if query.doing.startswith("apply migration") else ""
        return StoreUnavailableError(
            f"{self._where}: cannot {query.doing}: no answer within the store's timeout "
            f"({self.timeout:g} s); the connection was dropped{hint}"
        )

    def _no_connection(self, doing: str, cause: BaseException | None) -> StoreUnavailableError:
        """The error for a call that got no connection: why, when a direct try could tell."""
        if cause is not None:
            reason = redact(" ".join(str(cause).split()))
            return StoreUnavailableError(f"{self._where}: cannot {doing}: {reason}")
        return StoreUnavailableError(
            f"{self._where}: cannot {doing}: no connection within {self.timeout:g} s "
            f"(the pool holds at most {self._pool.max_size})"
        )

    def _closed_error(self) -> StoreUnavailableError:
        return StoreUnavailableError(f"{self._where} is closed")

    def _busy_schema(self) -> StoreUnavailableError:
        return StoreUnavailableError(
            f"{self._where}: another call is preparing the schema, still after {self.timeout:g} s"
        )

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


_MIGRATE_HINT = (
    "; migrations that take longer run with `zerda migrate` (or the store's migrate()), "
    "which has no time limit"
)


def _check_turns(turns: int | None) -> int | None:
    return None if turns is None else max(0, min(turns, _MAX_TURNS))


def _check_counter(counter: str | None) -> str | None:
    if counter is not None and (not isinstance(counter, str) or "\x00" in counter):
        raise ConfigurationError(f"a counter name is a string without NUL, got {counter!r}")
    return counter


def _may_be_held(message_id: object) -> bool:
    """Whether a session could hold a message of this id: printable text, as Message requires
    (which also keeps out what Postgres text cannot hold: NUL, lone surrogates)."""
    return isinstance(message_id, str) and message_id.isprintable()


# -- the sync store ---------------------------------------------------------------------------


class PostgresStore(_PostgresBase, ClosingStore):
    """Sessions in Postgres: any number of workers, processes and machines share them.

    Give either ``dsn`` (``postgresql://user@host/db`` or ``"host=... dbname=..."``: the store
    makes its own pool of ``min_size`` to ``max_size`` connections) or ``pool``, a
    :class:`psycopg_pool.ConnectionPool` you own (the store never closes it). Tables live in
    ``schema`` (created, and migrated, by the first call; ``zerda migrate`` does it ahead).

    Every call is one statement on an autocommit connection: one round trip. A write runs in
    a function that locks the session's row, so concurrent batches to one session queue there
    and get gap-free, unique positions; sessions do not wait for each other. A tail read is one
    query over two ranges of the primary key, whatever the session's length, and carries the
    session's metadata; ``append_then_tail`` appends and reads the tail under the same lock.

    Message ids: an append skips, in its statement, every message whose ``id`` the session
    holds (a unique index per session), so a retried batch is stored once; it returns how
    many messages it stored. Retention drops the ids of the messages it drops (system messages
    are kept, and so are their ids). JSON is kept exactly: messages and metadata values are
    stored as the JSON text Python wrote (``1e16`` stays a float, big ints stay exact, NUL
    characters are fine). ``compare_and_set`` sets one metadata key if it holds the value
    expected, compared as JSON values (:func:`~zerda.stores.same_json`), atomically under the
    session's lock; ``update_metadata`` refuses keys starting with ``zerda.``.

    ``ttl`` sets each written session's ``expires_at`` (updated_at + ttl; the TTL of the store
    that wrote last applies); ``purge_expired()`` deletes what has expired. ``max_messages``
    behaves as in :class:`~zerda.stores.InMemoryStore`.

    Editing the log (``delete_messages``, ``pop_turn``, ``fork``, ``edit_message``): each is
    one function call, one transaction, under the session row's lock like an append, so edits
    and appends to one session never interleave; positions and turns are renumbered from the
    first message deleted on (popping the newest turn moves nothing but the pinned messages in
    it). ``fork`` locks both sessions and copies the source's rows up to ``at`` with one
    ``INSERT ... SELECT`` (its cost: a copy of those rows and of the metadata).
    ``edit_message`` takes two statements (read the message, then store its edit only if it
    still reads the same, else read it again), so no lock is held while the client works.

    Every call returns or raises :class:`~zerda.StoreUnavailableError` within ``timeout``
    seconds (+0.25 s), however the server fails: waiting for a connection, connecting,
    reading the schema version and running the statement all share that time. The server
    cancels a statement that runs longer (``statement_timeout``, set on the store's own
    connections; the connection stays usable); a server that sends nothing at all (frozen, or
    cut off) loses the connection at the deadline: the store shuts its socket down and never
    reuses it (the error's cause is then a :class:`TimeoutError`). A write that timed out may
    still be applied by a server that wakes up later: retry it with the same messages (the
    same ids) and it is stored once. Applying schema migrations is the one thing without a
    time limit, when :meth:`migrate` does it (a migration may rewrite a big table). The error
    names the DSN without its password (psycopg's error chained); the store reconnects by
    itself once the server is back. A row that cannot be decoded raises
    :class:`~zerda.CorruptDataError`. Needs PostgreSQL 12 or later.

    Behind PgBouncer, which refuses the ``options`` connection parameter that carries the
    statement timeout, give the store a ``pool`` of your own (the client-side deadline still
    applies).
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

    # -- the driver -----------------------------------------------------------------------------

    def _call(self, statements: _Statements[_T]) -> _T:
        query = next(statements)  # the arguments are checked: now the I/O
        deadline = time.monotonic() + self.timeout
        self._start()
        if not self._ready:
            self._prepare(deadline)
        return self._drive(self._connected(statements, query, deadline))

    def _start(self) -> None:
        if self._closed:
            raise self._closed_error()
        if self._owns_pool and not self._opened:
            with self._open_lock:
                if not self._opened:
                    self._pool.open()
                    self._opened = True

    def _prepare(self, deadline: float) -> None:
        if not self._schema_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise self._busy_schema()
        try:
            if not self._ready:
                flow = self._schema_flow()
                self._drive(self._connected(flow, next(flow), deadline))
                self._ready = True
        finally:
            self._schema_lock.release()

    def _drive(self, flow: _Flow[_T]) -> _T:
        """Perform the flow's requests, sending each result back or throwing its error in."""
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                request = flow.send(reply) if error is None else flow.throw(error)
            except StopIteration as stop:
                result: _T = stop.value
                return result
            reply = error = None
            try:
                if isinstance(request, _Run):
                    reply = self._run(request.lease, request.query)
                elif isinstance(request, _Get):
                    reply = self._get(request.wait, request.deadline)
                elif isinstance(request, _Put):
                    self._put(request.lease)
                else:
                    reply = self._probe(request.wait)
            except BaseException as exc:
                error = exc

    def _get(self, wait: float, deadline: float) -> _Lease | None:
        try:
            conn = self._pool.getconn(timeout=wait)
        except PoolTimeout:
            return None
        autocommit = conn.autocommit
        if not autocommit:
            try:
                conn.autocommit = True  # an idle connection: no round trip
            except BaseException:
                self._pool.putconn(conn)
                raise
        return _Lease(conn, deadline, autocommit)

    def _run(self, lease: _Lease, query: _Query) -> Rows:
        conn = lease.conn
        if query.unbounded:
            return _execute(conn, query)
        deadline = lease.deadline + _GRACE
        if deadline <= time.monotonic():
            raise _TimedOut(sent=False)
        alarm = _WATCHDOG.arm(deadline, conn.fileno())
        try:
            rows = _execute(conn, query)
        except BaseException as exc:
            if _WATCHDOG.disarm(alarm):
                raise _TimedOut(sent=True) from exc
            raise
        if _WATCHDOG.disarm(alarm):  # answered just in time, but the socket is shut now
            lease.broken = True
        return rows

    def _put(self, lease: _Lease) -> None:
        conn = lease.conn
        if lease.broken:
            conn.close()
        elif not lease.autocommit and not conn.closed:
            try:
                conn.autocommit = False
            except psycopg.Error:
                conn.close()
        self._pool.putconn(conn)

    def _probe(self, wait: float) -> BaseException | None:
        """Connect once, outside the pool, to learn why the pool has no connection; a thread
        does it, so that the call waits no longer than ``wait`` (libpq's connect_timeout
        cannot be shorter than 2 s)."""
        conninfo = self._conninfo
        if conninfo is None or wait <= 0:
            return None
        outcome: list[BaseException | None] = []

        def attempt() -> None:
            try:
                psycopg.connect(conninfo, connect_timeout=max(2, math.ceil(self.timeout))).close()
            except psycopg.Error as exc:
                outcome.append(exc)
            else:
                outcome.append(None)

        thread = threading.Thread(target=attempt, name="zerda-postgres-probe", daemon=True)
        thread.start()
        thread.join(wait)
        return outcome[0] if outcome else None

    # -- the schema -----------------------------------------------------------------------------

    def schema_version(self) -> int:
        """How many schema migrations the schema has had (creating or migrating it first)."""
        deadline = time.monotonic() + self.timeout
        self._start()
        if not self._ready:
            self._prepare(deadline)
        return len(MIGRATIONS)

    def migrate(self) -> tuple[int, int]:
        """Bring the schema up to date now; its versions (before, after).

        The first call of any other method does the same, within the store's timeout; this
        is ``zerda migrate``'s way to do it ahead, and to say what it did. Reading the version
        keeps to the timeout; applying migrations has no time limit.
        """
        flow = self._schema_flow(on_purpose=True)
        query = next(flow)
        deadline = time.monotonic() + self.timeout
        self._start()
        with self._schema_lock:
            versions = self._drive(self._connected(flow, query, deadline))
            self._ready = True
        return versions

    # -- the contract ---------------------------------------------------------------------------

    def append(
        self, session_id: str, messages: Sequence[Message], tokens: TokenCounts | None = None
    ) -> int:
        return self._call(self._append(session_id, messages, tokens))

    def append_then_tail(
        self,
        session_id: str,
        messages: Sequence[Message],
        tokens: TokenCounts | None,
        turns: int | None,
        counter: str | None = None,
    ) -> tuple[int, Tail]:
        return self._call(self._append_then_tail(session_id, messages, tokens, turns, counter))

    def tail(self, session_id: str, turns: int | None, counter: str | None = None) -> Tail:
        return self._call(self._tail(session_id, turns, counter))

    def history(self, session_id: str) -> list[Message]:
        return self._call(self._history(session_id))

    def get_metadata(self, session_id: str) -> dict[str, Any]:
        return self._call(self._get_metadata(session_id))

    def update_metadata(self, session_id: str, values: Mapping[str, Any]) -> None:
        self._call(self._update_metadata(session_id, values))

    def compare_and_set(self, session_id: str, key: str, expected: Any, value: Any) -> bool:
        return self._call(self._compare_and_set(session_id, key, expected, value))

    def list_sessions(self) -> list[SessionInfo]:
        return self._call(self._list_sessions())

    def delete_session(self, session_id: str) -> bool:
        return self._call(self._delete_session(session_id))

    def clear(self) -> None:
        self._call(self._clear())

    def purge_expired(self) -> int:
        return self._call(self._purge_expired())

    def delete_messages(self, session_id: str, ids: Collection[str]) -> int:
        return self._call(self._delete_messages(session_id, ids))

    def pop_turn(self, session_id: str) -> list[Message]:
        return self._call(self._pop_turn(session_id))

    def fork(self, session_id: str, new_session_id: str, at: str | None = None) -> int:
        """See :meth:`Store.fork <zerda.stores.Store.fork>`. It costs a copy of the source's
        rows up to ``at`` (one ``INSERT ... SELECT`` in the call's transaction) and of its
        metadata rows."""
        return self._call(self._fork(session_id, new_session_id, at))

    def edit_message(
        self, session_id: str, message_id: str, content: str | tuple[Part, ...] | None
    ) -> Message:
        return self._call(self._edit_message(session_id, message_id, content))

    def close(self) -> None:
        """Close the store (and its pool, if it made it); later calls raise. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_pool and self._opened:
            self._pool.close(timeout=self.timeout)


def _execute(conn: psycopg.Connection[Any], query: _Query) -> Rows:
    cursor = conn.cursor(row_factory=tuple_row)
    cursor.execute(query.text, query.params)
    return cursor.fetchall() if cursor.description is not None else []


# -- the async store --------------------------------------------------------------------------


class AsyncPostgresStore(_PostgresBase, AsyncClosingStore):
    """The async protocol over Postgres, on psycopg's async connections: no thread, no block.

    The same options, SQL and behaviour as :class:`PostgresStore` (ids, exact JSON,
    ``acompare_and_set``, and every call done or failed within ``timeout``: the deadline is a
    timer on the event loop); ``pool`` is a :class:`psycopg_pool.AsyncConnectionPool`. The
    store's own pool opens on the first call, in the running event loop (use the store from
    that loop only). Close it with ``await store.aclose()`` or ``async with``.

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

    # -- the driver -----------------------------------------------------------------------------

    async def _call(self, statements: _Statements[_T]) -> _T:
        query = next(statements)  # the arguments are checked: now the I/O
        deadline = time.monotonic() + self.timeout
        await self._start()
        if not self._ready:
            await self._prepare(deadline)
        return await self._drive(self._connected(statements, query, deadline))

    async def _start(self) -> None:
        if self._closed:
            raise self._closed_error()
        if self._owns_pool and not self._opened:
            async with self._open_lock:
                if not self._opened:
                    await self._pool.open()
                    self._opened = True

    async def _prepare(self, deadline: float) -> None:
        try:
            await asyncio.wait_for(
                self._schema_lock.acquire(), max(0.0, deadline - time.monotonic())
            )
        except asyncio.TimeoutError:
            raise self._busy_schema() from None
        try:
            if not self._ready:
                flow = self._schema_flow()
                await self._drive(self._connected(flow, next(flow), deadline))
                self._ready = True
        finally:
            self._schema_lock.release()

    async def _drive(self, flow: _Flow[_T]) -> _T:
        """Perform the flow's requests, sending each result back or throwing its error in."""
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                request = flow.send(reply) if error is None else flow.throw(error)
            except StopIteration as stop:
                result: _T = stop.value
                return result
            reply = error = None
            try:
                if isinstance(request, _Run):
                    reply = await self._run(request.lease, request.query)
                elif isinstance(request, _Get):
                    reply = await self._get(request.wait, request.deadline)
                elif isinstance(request, _Put):
                    await self._put(request.lease)
                else:
                    reply = await self._probe(request.wait)
            except BaseException as exc:
                error = exc

    async def _get(self, wait: float, deadline: float) -> _Lease | None:
        try:
            conn = await self._pool.getconn(timeout=wait)
        except PoolTimeout:
            return None
        autocommit = conn.autocommit
        if not autocommit:
            try:
                await conn.set_autocommit(True)
            except BaseException:
                await self._pool.putconn(conn)
                raise
        return _Lease(conn, deadline, autocommit)

    async def _run(self, lease: _Lease, query: _Query) -> Rows:
        conn = lease.conn
        if query.unbounded:
            return await _aexecute(conn, query)
        left = lease.deadline + _GRACE - time.monotonic()
        if left <= 0:
            raise _TimedOut(sent=False)
        fired: list[bool] = []
        timer = asyncio.get_running_loop().call_later(left, _shut_down_async, conn, fired)
        try:
            rows = await _aexecute(conn, query)
        except BaseException as exc:
            timer.cancel()
            if fired:
                raise _TimedOut(sent=True) from exc
            raise
        timer.cancel()
        if fired:
            lease.broken = True
        return rows

    async def _put(self, lease: _Lease) -> None:
        conn = lease.conn
        if lease.broken:
            await conn.close()
        elif not lease.autocommit and not conn.closed:
            try:
                await conn.set_autocommit(False)
            except psycopg.Error:
                await conn.close()
        await self._pool.putconn(conn)

    async def _probe(self, wait: float) -> BaseException | None:
        """Connect once, outside the pool, to learn why the pool has no connection, waiting
        no longer than ``wait``."""
        if self._conninfo is None or wait <= 0:
            return None
        try:
            conn = await asyncio.wait_for(
                psycopg.AsyncConnection.connect(
                    self._conninfo, connect_timeout=max(2, math.ceil(self.timeout))
                ),
                wait,
            )
        except psycopg.Error as exc:
            return exc
        except asyncio.TimeoutError:
            return None
        await conn.close()
        return None

    # -- the schema -----------------------------------------------------------------------------

    async def aschema_version(self) -> int:
        """How many schema migrations the schema has had (creating or migrating it first)."""
        deadline = time.monotonic() + self.timeout
        await self._start()
        if not self._ready:
            await self._prepare(deadline)
        return len(MIGRATIONS)

    async def amigrate(self) -> tuple[int, int]:
        """Bring the schema up to date now; its versions (before, after). Reading the version
        keeps to the timeout; applying migrations has no time limit."""
        flow = self._schema_flow(on_purpose=True)
        query = next(flow)
        deadline = time.monotonic() + self.timeout
        await self._start()
        async with self._schema_lock:
            versions = await self._drive(self._connected(flow, query, deadline))
            self._ready = True
        return versions

    # -- the contract ---------------------------------------------------------------------------

    async def aappend(
        self, session_id: str, messages: Sequence[Message], tokens: TokenCounts | None = None
    ) -> int:
        return await self._call(self._append(session_id, messages, tokens))

    async def aappend_then_tail(
        self,
        session_id: str,
        messages: Sequence[Message],
        tokens: TokenCounts | None,
        turns: int | None,
        counter: str | None = None,
    ) -> tuple[int, Tail]:
        return await self._call(
            self._append_then_tail(session_id, messages, tokens, turns, counter)
        )

    async def atail(self, session_id: str, turns: int | None, counter: str | None = None) -> Tail:
        return await self._call(self._tail(session_id, turns, counter))

    async def ahistory(self, session_id: str) -> list[Message]:
        return await self._call(self._history(session_id))

    async def aget_metadata(self, session_id: str) -> dict[str, Any]:
        return await self._call(self._get_metadata(session_id))

    async def aupdate_metadata(self, session_id: str, values: Mapping[str, Any]) -> None:
        await self._call(self._update_metadata(session_id, values))

    async def acompare_and_set(self, session_id: str, key: str, expected: Any, value: Any) -> bool:
        return await self._call(self._compare_and_set(session_id, key, expected, value))

    async def alist_sessions(self) -> list[SessionInfo]:
        return await self._call(self._list_sessions())

    async def adelete_session(self, session_id: str) -> bool:
        return await self._call(self._delete_session(session_id))

    async def aclear(self) -> None:
        await self._call(self._clear())

    async def apurge_expired(self) -> int:
        return await self._call(self._purge_expired())

    async def adelete_messages(self, session_id: str, ids: Collection[str]) -> int:
        return await self._call(self._delete_messages(session_id, ids))

    async def apop_turn(self, session_id: str) -> list[Message]:
        return await self._call(self._pop_turn(session_id))

    async def afork(self, session_id: str, new_session_id: str, at: str | None = None) -> int:
        """See :meth:`PostgresStore.fork`: a copy of the source's rows up to ``at``."""
        return await self._call(self._fork(session_id, new_session_id, at))

    async def aedit_message(
        self, session_id: str, message_id: str, content: str | tuple[Part, ...] | None
    ) -> Message:
        return await self._call(self._edit_message(session_id, message_id, content))

    async def aclose(self) -> None:
        """Close the store (and its pool, if it made it); later calls raise. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_pool and self._opened:
            await self._pool.close(timeout=self.timeout)


async def _aexecute(conn: psycopg.AsyncConnection[Any], query: _Query) -> Rows:
    cursor = conn.cursor(row_factory=tuple_row)
    await cursor.execute(query.text, query.params)
    return await cursor.fetchall() if cursor.description is not None else []

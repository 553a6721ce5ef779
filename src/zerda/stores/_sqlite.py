"""The SQLite store: sessions in one file, WAL, one transaction per batch, ordered migrations."""

from __future__ import annotations

import asyncio
import heapq
import json
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from zerda.errors import (
    ConfigurationError,
    CorruptDataError,
    StoreUnavailableError,
    ZerdaError,
)
from zerda.messages import PINNED, Message, Role
from zerda.parts import Part
from zerda.stores._base import (
    AsyncClosingStore,
    BoundedCache,
    ClosingStore,
    DecodedMessages,
    SessionInfo,
    Since,
    Store,
    Tail,
    ThreadedAsync,
    TokenCounts,
    WouldWait,
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
    new_ids,
    same_json,
    session_exists,
)

__all__ = ["MIGRATIONS", "AsyncSQLiteStore", "SQLiteStore"]

_T = TypeVar("_T")
_USER = Role.USER

# System messages belong to no turn; they are stored under this turn number, so that they sort
# before every turn of their session and read as one short range of the primary key.
SYSTEM_TURN = -1
# Token counts kept per store, by stored text (decoded messages: DecodedMessages).
_CACHE_SIZE = 4096
# Committed writes between two of the store's checkpoints: a few hundred to a thousand WAL
# pages for turns of a few messages (SQLite's automatic checkpoint is at 1,000 pages).
_CHECKPOINT_EVERY = 100

# -- schema migrations ------------------------------------------------------------------------
#
# Ordered, named functions, each applied once and recorded by name in ``_zerda_migrations``.
# Add a migration by appending a function; never edit or reorder one that has shipped.

Migration = Callable[[sqlite3.Connection], None]
MIGRATIONS: list[Migration] = []


def _migration(fn: Migration) -> Migration:
    MIGRATIONS.append(fn)
    return fn


@_migration
def m001_sessions_and_messages(db: sqlite3.Connection) -> None:
    # A session's counters describe its log without reading it: messages hold absolute
    # positions ``seq`` and turn numbers ``turn``; retention moves ``first_seq`` and
    # ``first_turn`` forward. The session keeps ``seq`` and ``turn`` numbering across trims.
    db.execute(
        """
        CREATE TABLE sessions (
            sid INTEGER PRIMARY KEY,
            session_id TEXT NOT NULL UNIQUE,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            metadata TEXT NOT NULL DEFAULT '{}',
            next_seq INTEGER NOT NULL DEFAULT 0,       -- position of the next message
            first_seq INTEGER NOT NULL DEFAULT 0,      -- first position retention kept
            next_turn INTEGER NOT NULL DEFAULT 0,      -- number of the next turn
            first_turn INTEGER NOT NULL DEFAULT 0,     -- first turn retention kept
            system_trimmed INTEGER NOT NULL DEFAULT 0  -- system messages before first_seq
        )
        """
    )
    # Clustered by (session, turn, position): the newest k turns of a session are one range
    # of the primary key, read in order from neighbouring pages with no second lookup,
    # whatever the file holds. System messages (turn -1) are a range of their own at the
    # front of the session. The price of WITHOUT ROWID with rows this size (a few hundred
    # bytes) is a deeper tree, since its inner pages hold whole rows: one or two more cached
    # pages per seek, which benchmarks/sqlite_store.py shows does not show at 1,000,000 rows.
    db.execute(
        """
        CREATE TABLE messages (
            sid INTEGER NOT NULL,
            turn INTEGER NOT NULL,
            seq INTEGER NOT NULL,
            role TEXT NOT NULL,
            body TEXT NOT NULL,    -- Message.to_json()
            tokens TEXT,           -- {"counter name": count, ...} or NULL
            PRIMARY KEY (sid, turn, seq)
        ) WITHOUT ROWID
        """
    )


@_migration
def m002_message_ids(db: sqlite3.Connection) -> None:
    # Message.id, unique per session: an append skips the messages whose id the session
    # holds, so a retried batch is stored once. Rows written before ids existed have none.
    db.execute("ALTER TABLE messages ADD COLUMN id TEXT")
    db.execute("CREATE UNIQUE INDEX messages_id ON messages (sid, id) WHERE id IS NOT NULL")


@_migration
def m003_session_generations(db: sqlite3.Connection) -> None:
    # A number drawn afresh whenever a session's log changes other than by an append (created,
    # started afresh, trimmed, edited, forked into): a cursor that names another is stale, so
    # tail_since answers what came after a cursor only while the log up to it is unchanged.
    db.execute("ALTER TABLE sessions ADD COLUMN generation INTEGER NOT NULL DEFAULT 0")


# -- SQL (module constants, so sqlite3's statement cache reuses the prepared statements) -----

_SESSION = (
    "SELECT sid, created_at, updated_at, next_seq, first_seq, next_turn, first_turn, "
    "system_trimmed, metadata, generation FROM sessions WHERE session_id = ?"
)
_NEW_SESSION = (
    "INSERT INTO sessions (session_id, created_at, updated_at, generation) VALUES (?, ?, ?, ?)"
)
_RESET_SESSION = (
    "UPDATE sessions SET created_at = ?, updated_at = ?, metadata = '{}', next_seq = 0, "
    "first_seq = 0, next_turn = 0, first_turn = 0, system_trimmed = 0, generation = ? "
    "WHERE sid = ?"
)
_AFTER_APPEND = "UPDATE sessions SET updated_at = ?, next_seq = ?, next_turn = ? WHERE sid = ?"
_AFTER_TRIM = (
    "UPDATE sessions SET first_seq = ?, first_turn = ?, system_trimmed = ?, generation = ? "
    "WHERE sid = ?"
)
_INSERT = (
    "INSERT INTO messages (sid, turn, seq, role, body, tokens, id) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
# The ids of a batch (a JSON array) that the session already holds.
_HELD_IDS = "SELECT id FROM messages WHERE sid = ? AND id IN (SELECT value FROM json_each(?))"
_SYSTEM_ROWS = "SELECT body, tokens FROM messages WHERE sid = ? AND turn = -1 ORDER BY seq"
TAIL_QUERY = (
    "SELECT turn, body, tokens FROM messages WHERE sid = ? AND turn >= ? ORDER BY turn, seq"
)
# The turn rows from a position on (their turns from a number on: one range of the key).
_ROWS_SINCE = (
    "SELECT turn, body, tokens FROM messages WHERE sid = ? AND turn >= ? AND seq >= ? "
    "ORDER BY turn, seq"
)
_ALL_ROWS = "SELECT turn, seq, body FROM messages WHERE sid = ? ORDER BY turn, seq"
_TURN_STARTS = "SELECT turn, seq FROM messages WHERE sid = ? AND turn >= ? ORDER BY turn, seq"
_SYSTEM_BEFORE = "SELECT count(*) FROM messages WHERE sid = ? AND turn = -1 AND seq < ?"
_DROP_TURNS = "DELETE FROM messages WHERE sid = ? AND turn >= 0 AND turn < ?"
_DROP_MESSAGES = "DELETE FROM messages WHERE sid = ?"
_DROP_SESSION = "DELETE FROM sessions WHERE sid = ?"
_SET_METADATA = "UPDATE sessions SET metadata = ?, updated_at = ? WHERE sid = ?"
_LIST = (
    "SELECT session_id, next_seq - first_seq + system_trimmed, next_turn - first_turn, "
    "created_at, updated_at FROM sessions WHERE ? IS NULL OR updated_at + ? > ? "
    "ORDER BY session_id"
)
_EXPIRED = "SELECT sid FROM sessions WHERE updated_at + ? <= ?"

# Editing the log (issue #16). An edit keeps the invariants the reads rely on: positions from
# first_seq to next_seq are contiguous, turns from first_turn to next_turn are contiguous (both
# 0 when no turn is left), and only system rows sit before first_seq (system_trimmed of them).
_BY_ID = "SELECT turn, seq, body FROM messages WHERE sid = ? AND id = ?"
_SEQS_OF_IDS = "SELECT seq FROM messages WHERE sid = ? AND id IN (SELECT value FROM json_each(?))"
_TURN_START = "SELECT min(seq) FROM messages WHERE sid = ? AND turn = ?"
# The turn rows from the newest back, and the system rows from a position on.
_TURN_ROWS_BACK = (
    "SELECT turn, seq, role, body, tokens, id FROM messages WHERE sid = ? AND turn >= 0 "
    "ORDER BY turn DESC, seq DESC"
)
_SYSTEM_ROWS_FROM = (
    "SELECT turn, seq, role, body, tokens, id FROM messages "
    "WHERE sid = ? AND turn = -1 AND seq >= ? ORDER BY seq"
)
_TRIMMED_SYSTEM = "SELECT seq FROM messages WHERE sid = ? AND turn = -1 AND seq < ? ORDER BY seq"
_DROP_ROW = "DELETE FROM messages WHERE sid = ? AND turn = ? AND seq = ?"
_MOVE_SYSTEM = "UPDATE messages SET seq = ? WHERE sid = ? AND turn = -1 AND seq = ?"
_EDIT_ROW = "UPDATE messages SET body = ?, tokens = NULL WHERE sid = ? AND turn = ? AND seq = ?"
_AFTER_EDIT = (
    "UPDATE sessions SET updated_at = ?, next_seq = ?, first_seq = ?, next_turn = ?, "
    "first_turn = ?, system_trimmed = ?, generation = ? WHERE sid = ?"
)
# A fork's rows, renumbered from 0: the trimmed system rows one by one, then the source's log
# from first_seq up to a position, shifted (turns counted from first_turn).
_COPY_TRIMMED = (
    "INSERT INTO messages (sid, turn, seq, role, body, tokens, id) "
    "SELECT ?, turn, ?, role, body, tokens, id FROM messages "
    "WHERE sid = ? AND turn = -1 AND seq = ?"
)
_COPY_ROWS = (
    "INSERT INTO messages (sid, turn, seq, role, body, tokens, id) "
    "SELECT ?, CASE WHEN turn < 0 THEN turn ELSE turn - ? END, seq - ?, role, body, tokens, id "
    "FROM messages WHERE sid = ? AND seq >= ? AND seq <= ?"
)
_NEXT_TURN = "SELECT coalesce(max(turn) + 1, 0) FROM messages WHERE sid = ?"
_FORKED = (
    "UPDATE sessions SET created_at = ?, updated_at = ?, metadata = ?, next_seq = ?, "
    "first_seq = 0, next_turn = ?, first_turn = 0, system_trimmed = 0, generation = ? "
    "WHERE sid = ?"
)
_PINNED_ROLES = frozenset(role.value for role in PINNED)


class _Row(NamedTuple):
    """A session's row of the ``sessions`` table."""

    sid: int
    created_at: float
    updated_at: float
    next_seq: int
    first_seq: int
    next_turn: int
    first_turn: int
    system_trimmed: int
    metadata: str
    generation: int


def _cursor(row: _Row) -> tuple[int, int, int, int]:
    """Where a read of ``row``'s session ends: the session, its generation, the next position
    and the next turn number (see tail_since)."""
    return (row.sid, row.generation, row.next_seq, row.next_turn)


def _generation() -> int:
    """A fresh generation (see m003_session_generations): random, so that a session deleted
    and made again under a reused ``sid`` does not take up an old one."""
    return random.getrandbits(62)


# What a tail read takes out of the transaction: the session's row, its system rows and the
# rows of the turns asked for (None: no live session).
_Read = tuple[_Row, list[Any], list[Any]] | None


def _check_path(path: object) -> str:
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str) or not path:
        raise ConfigurationError(
            f"path must be a file path (str or os.PathLike) or ':memory:', got {path!r}"
        )
    return path


class SQLiteStore(ClosingStore):
    """Sessions in a SQLite file: the embedded, persistent store.

    Many stores, threads and processes may share one file: each batch is one ``BEGIN
    IMMEDIATE`` transaction, so writers queue on the file lock (for up to ``timeout`` seconds)
    and a batch is stored whole or not at all. Reading the newest k turns is one range of the
    primary key: its cost is what it returns, however long the session and however big the
    file. ``ttl`` and ``max_messages`` behave as in :class:`~zerda.stores.InMemoryStore`.

    ``path`` is a file path (missing parent folders are created) or ``":memory:"``. A file
    that is not a database raises :class:`~zerda.CorruptDataError`; a file that cannot be
    opened or written, :class:`~zerda.StoreUnavailableError` (both name the path and chain
    sqlite3's error). The schema is migrated on open; a file written by a newer Zerda is
    refused rather than misread.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        ttl: float | None = None,
        max_messages: int | None = None,
        clock: Callable[[], float] = time.time,
        timeout: float = 30.0,
    ) -> None:
        check_retention(ttl, max_messages)
        self.path = _check_path(path)
        self._where = f"SQLite store {self.path!r}"
        self.ttl = ttl
        self.max_messages = max_messages
        self.timeout = check_timeout(timeout, zero=True)
        self._busy_timeout = f"PRAGMA busy_timeout = {int(self.timeout * 1000)}"
        self._clock = clock
        # One connection per store, used under a lock. SQLite runs one writer at a time per
        # file anyway, and a read here takes microseconds, so per-thread connections would
        # buy little and cost much: connections left open by threads that ended, and a
        # close() that cannot reach them.
        self._lock = threading.Lock()
        self._now = threading.local()  # .active: this thread's call must not wait (run_now)
        # Checkpoints: the store's own, in a thread (_checkpoint).
        self._writes = 0
        self._checkpointing = False
        self._decoded = DecodedMessages()
        self._counts: BoundedCache[str, dict[str, int | None]] = BoundedCache(_CACHE_SIZE)
        self._db: sqlite3.Connection | None = self._open()
        self._schema_version = len(MIGRATIONS)

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r})"

    @property
    def schema_version(self) -> int:
        """How many schema migrations the file has had (the newest this code knows of)."""
        return self._schema_version

    # -- opening and migrating ---------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        if self.path != ":memory:":
            try:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreUnavailableError(
                    f"cannot create the folder of SQLite store {self.path!r}: {exc}"
                ) from exc
        try:
            db = sqlite3.connect(
                self.path,
                timeout=self.timeout,
                isolation_level=None,  # transactions are ours: BEGIN IMMEDIATE per batch
                check_same_thread=False,  # guarded by self._lock instead
            )
        except sqlite3.Error as exc:
            raise self._error(exc, "open") from exc
        try:
            db.execute(self._busy_timeout)
            # Under WAL, NORMAL syncs at checkpoints only: a commit that returned survives the
            # process being killed (it is in the WAL, which the OS holds), while an OS crash or
            # power cut may lose the last commits, never the file's consistency. FULL would
            # add an fsync to every batch for that last case.
            db.execute("PRAGMA synchronous = NORMAL")
            # The store checkpoints the WAL itself, off the caller's thread (_checkpoint).
            db.execute("PRAGMA wal_autocheckpoint = 0")
            self._retry_busy(lambda: self._set_up(db))
        except BaseException as exc:
            db.close()
            if isinstance(exc, sqlite3.Error):
                raise self._error(exc, "open") from exc
            raise
        return db

    def _set_up(self, db: sqlite3.Connection) -> None:
        # Switching to WAL takes a lock that SQLite does not wait for, so only switch when
        # needed: once per file, not at every open.
        (mode,) = db.execute("PRAGMA journal_mode").fetchone()
        if mode not in ("wal", "memory"):
            db.execute("PRAGMA journal_mode = WAL")
        self._migrate(db)

    def _retry_busy(self, step: Callable[[], None]) -> None:
        """Run ``step``, trying again while the file is locked, for up to ``timeout`` seconds.

        Most waits are sqlite3's busy handler's; this covers the few that do not use it
        (several processes creating the same file at once, and switching it to WAL).
        """
        deadline = time.monotonic() + self.timeout
        delay = 0.001
        while True:
            try:
                step()
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
            time.sleep(delay)
            delay = min(2 * delay, 0.05)

    def _migrate(self, db: sqlite3.Connection) -> None:
        """Apply the migrations the file has not had, in order, in one transaction."""
        known = [m.__name__ for m in MIGRATIONS]
        if self._applied(db) == known:
            return  # the common case: no write lock needed to open
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(
                "CREATE TABLE IF NOT EXISTS _zerda_migrations "
                "(name TEXT PRIMARY KEY, applied_at REAL NOT NULL)"
            )
            applied = self._applied(db)
            unknown = [name for name in applied if name not in known]
            if unknown:
                raise StoreUnavailableError(
                    f"SQLite store {self.path!r} has schema version {len(applied)}, newer than "
                    f"this Zerda knows ({len(known)}; unknown migrations: {', '.join(unknown)}); "
                    "upgrade zerda-memory to open it"
                )
            for migration in MIGRATIONS:
                if migration.__name__ not in applied:
                    migration(db)
                    db.execute(
                        "INSERT INTO _zerda_migrations (name, applied_at) VALUES (?, ?)",
                        (migration.__name__, time.time()),
                    )
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    @staticmethod
    def _applied(db: sqlite3.Connection) -> list[str]:
        try:
            rows = db.execute("SELECT name FROM _zerda_migrations ORDER BY rowid").fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []
            raise
        return [name for (name,) in rows]

    # -- connection, transactions, errors ----------------------------------------------------

    def _error(self, exc: sqlite3.Error, doing: str) -> ZerdaError:
        if isinstance(exc, sqlite3.OperationalError | sqlite3.ProgrammingError):
            return StoreUnavailableError(f"SQLite store {self.path!r}: cannot {doing}: {exc}")
        # "file is not a database", "database disk image is malformed", broken constraints.
        return CorruptDataError(f"SQLite store {self.path!r}: cannot {doing}: {exc}")

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            raise StoreUnavailableError(f"SQLite store {self.path!r} is closed")
        return self._db

    def run_now(self, call: Callable[[SQLiteStore], _T]) -> _T:
        """``call(self)`` on this thread if its transaction need not wait for a lock, else
        ``WouldWait``, with nothing done (the transaction that would have waited is rolled
        back). For calls that are one transaction: what ``AsyncOverThread`` runs without a
        hop to a worker thread."""
        self._now.active = True
        try:
            return call(self)
        finally:
            self._now.active = False

    @contextmanager
    def _transaction(self, begin: str, doing: str) -> Iterator[sqlite3.Connection]:
        """One transaction under the store's lock; sqlite3 errors become Zerda errors.

        Under :meth:`run_now` it takes neither the lock nor the file's locks if it would
        have to wait for them: it raises WouldWait instead."""
        nowait = getattr(self._now, "active", False)
        writer = begin != "BEGIN"
        # Only a writer waits for another connection under WAL (readers read a snapshot).
        refuse_busy = nowait and writer
        if not self._lock.acquire(blocking=not nowait):
            raise WouldWait
        try:
            db = self._connection()
            if refuse_busy:
                db.execute("PRAGMA busy_timeout = 0")
            try:
                db.execute(begin)
                yield db
                db.execute("COMMIT")
            except BaseException as exc:
                if db.in_transaction:
                    with suppress(sqlite3.Error):  # the first error is the one to report
                        db.execute("ROLLBACK")
                if refuse_busy and isinstance(exc, sqlite3.OperationalError) and _locked(exc):
                    raise WouldWait from exc
                if isinstance(exc, sqlite3.Error):
                    raise self._error(exc, doing) from exc
                raise
            finally:
                if refuse_busy:
                    db.execute(self._busy_timeout)
            if writer:
                self._written()
        finally:
            self._lock.release()

    def _written(self) -> None:
        """Count a committed write; every ``_CHECKPOINT_EVERY``, start a checkpoint."""
        self._writes += 1
        if self._writes < _CHECKPOINT_EVERY or self._checkpointing or self.path == ":memory:":
            return
        self._writes = 0
        self._checkpointing = True
        threading.Thread(
            target=self._checkpoint, name="zerda-sqlite-checkpoint", daemon=True
        ).start()

    def _checkpoint(self) -> None:
        """Copy the WAL's pages into the file, in a thread of its own.

        SQLite's automatic checkpoint would run inside the commit that crosses its threshold,
        fsync included: that caller, or the event loop a short call runs on (``run_now``),
        would stop for it. Here the store's lock is held meanwhile (so that the checkpoint
        completes and the next write starts the WAL over), and calls wait for it in their
        threads, while a short call from async code goes to a thread. A checkpoint that fails
        leaves the pages in the WAL for the next one (or the last close)."""
        try:
            with self._lock:
                if self._db is not None:
                    self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error:
            pass
        finally:
            self._checkpointing = False

    def _write(self, doing: str) -> AbstractContextManager[sqlite3.Connection]:
        # BEGIN IMMEDIATE takes the write lock up front: writers queue (busy_timeout) instead
        # of deadlocking on a read lock each wants to upgrade.
        return self._transaction("BEGIN IMMEDIATE", doing)

    def _read(self, doing: str) -> AbstractContextManager[sqlite3.Connection]:
        # A read transaction: the session row and its messages come from one snapshot.
        return self._transaction("BEGIN", doing)

    def close(self) -> None:
        """Close the connection; later calls raise :class:`~zerda.StoreUnavailableError`."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    # -- helpers (inside a transaction) -------------------------------------------------------

    def _session(self, db: sqlite3.Connection, session_id: str) -> _Row | None:
        row = db.execute(_SESSION, (session_id,)).fetchone()
        return None if row is None else _Row(*row)

    def _expired(self, row: _Row, now: float) -> bool:
        return self.ttl is not None and row.updated_at + self.ttl <= now

    def _live(self, db: sqlite3.Connection, session_id: str) -> _Row | None:
        """The session's row if it exists and has not expired.

        Reads have no side effects: an expired session reads as absent and stays in the file
        until ``purge_expired()`` (or a write, which starts it afresh).
        """
        row = self._session(db, session_id)
        if row is None or self._expired(row, self._clock()):
            return None
        return row

    def _writable(self, db: sqlite3.Connection, session_id: str, now: float) -> _Row:
        """The session's row, created (or, if expired, started afresh) for a write at ``now``."""
        row = self._session(db, session_id)
        if row is not None and not self._expired(row, now):
            return row
        generation = _generation()
        if row is None:
            sid = db.execute(_NEW_SESSION, (session_id, now, now, generation)).lastrowid
            assert sid is not None
            return _Row(sid, now, now, 0, 0, 0, 0, 0, "{}", generation)
        db.execute(_DROP_MESSAGES, (row.sid,))
        db.execute(_RESET_SESSION, (now, now, generation, row.sid))
        return _Row(row.sid, now, now, 0, 0, 0, 0, 0, "{}", generation)

    def _decode(self, body: str, session_id: str, remember: bool = True) -> Message:
        return self._decoded.decode(body, self._where, session_id, remember)

    def _count(self, tokens: str | None, counter: str, session_id: str) -> int | None:
        if tokens is None:
            return None
        counts = self._counts.get(tokens)  # few distinct texts: {"counter": n} for small n
        if counts is None:
            counts = self._counts.recall(tokens)
        if counts is None:
            try:
                counts = json.loads(tokens)
                if not isinstance(counts, dict):
                    raise TypeError(f"expected a JSON object, got {tokens[:60]!r}")
            except (ValueError, TypeError) as exc:
                raise CorruptDataError(
                    f"SQLite store {self.path!r}: session {session_id!r} holds token counts "
                    f"that cannot be decoded: {exc}"
                ) from exc
            self._counts.put(tokens, counts)
        count: int | None = counts.get(counter)
        return count

    def _trim(self, db: sqlite3.Connection, row: _Row, next_seq: int) -> None:
        """Drop the oldest whole turns while at least ``max_messages`` messages stay.

        Walks the kept turns from the oldest and stops at the first that must stay, so the
        work is what gets deleted (plus one turn).
        """
        keep = self.max_messages
        assert keep is not None
        if next_seq - row.first_seq <= keep:
            return
        limit = next_seq - keep  # the newest turn starting at or before it is the cut
        cut_turn, cut_seq = -1, -1
        cursor = db.execute(_TURN_STARTS, (row.sid, row.first_turn))
        for turn, seq in cursor:
            if seq > limit:
                break
            if turn != cut_turn:
                cut_turn, cut_seq = turn, seq
        cursor.close()
        if cut_turn <= row.first_turn:
            return
        db.execute(_DROP_TURNS, (row.sid, cut_turn))
        (system_trimmed,) = db.execute(_SYSTEM_BEFORE, (row.sid, cut_seq)).fetchone()
        db.execute(_AFTER_TRIM, (cut_seq, cut_turn, system_trimmed, _generation(), row.sid))

    # -- the contract ----------------------------------------------------------------------------

    def append(
        self, session_id: str, messages: Sequence[Message], tokens: TokenCounts | None = None
    ) -> int:
        check_batch(messages, tokens)
        check_session_id(session_id)
        # Encode the batch before taking the lock: the transaction holds the file's write lock.
        bodies = [m.to_json() for m in messages]
        counts = _encode_counts(tokens or {}, len(messages))
        with self._write("append") as db:
            stored = self._append(db, session_id, messages, bodies, counts)
        # The next tail will read these back: let it find them decoded.
        self._decoded.add(bodies, messages)
        return stored

    def append_then_tail(
        self,
        session_id: str,
        messages: Sequence[Message],
        tokens: TokenCounts | None,
        turns: int | None,
        counter: str | None = None,
    ) -> tuple[int, Tail]:
        check_batch(messages, tokens)
        check_session_id(session_id)
        bodies = [m.to_json() for m in messages]
        counts = _encode_counts(tokens or {}, len(messages))
        with self._write("append") as db:
            stored = self._append(db, session_id, messages, bodies, counts)
            read = self._tail_rows(db, session_id, turns)
        self._decoded.add(bodies, messages)
        return stored, self._tail_of(read, session_id, counter)

    def _append(
        self,
        db: sqlite3.Connection,
        session_id: str,
        messages: Sequence[Message],
        bodies: list[str],
        counts: list[str | None],
    ) -> int:
        """Append the encoded batch in the write transaction; how many messages it stored."""
        now = self._clock()
        row = self._writable(db, session_id, now)
        keep: Sequence[int] = range(len(messages))
        ids = [m.id for m in messages if m.id is not None]
        if ids and row.next_seq > row.first_seq:
            held = {i for (i,) in db.execute(_HELD_IDS, (row.sid, json.dumps(ids)))}
            if held:
                keep = new_ids(messages, held.__contains__)
        seq, turn = row.next_seq, row.next_turn
        rows: list[tuple[object, ...]] = []
        for i in keep:
            m = messages[i]
            role = m.role
            if role in PINNED:
                at = SYSTEM_TURN
            else:
                if role is _USER or turn == 0:
                    turn += 1
                at = turn - 1
            rows.append((row.sid, at, seq + len(rows), role.value, bodies[i], counts[i], m.id))
        db.executemany(_INSERT, rows)
        next_seq = seq + len(rows)
        db.execute(_AFTER_APPEND, (now, next_seq, turn, row.sid))
        if self.max_messages is not None:
            self._trim(db, row, next_seq)
        return len(rows)

    def tail(self, session_id: str, turns: int | None, counter: str | None = None) -> Tail:
        check_session_id(session_id)
        with self._read("read a tail") as db:
            read = self._tail_rows(db, session_id, turns)
        return self._tail_of(read, session_id, counter)

    def _tail_rows(self, db: sqlite3.Connection, session_id: str, turns: int | None) -> _Read:
        """The session's row, its system rows and the rows of its newest ``turns`` turns, read
        in the transaction; decoding waits until the lock is released."""
        row = self._live(db, session_id)
        if row is None:
            return None
        total_turns = row.next_turn - row.first_turn
        n = total_turns if turns is None else max(0, min(turns, total_turns))
        system_rows = db.execute(_SYSTEM_ROWS, (row.sid,)).fetchall()
        rows = db.execute(TAIL_QUERY, (row.sid, row.next_turn - n)).fetchall() if n else []
        return row, system_rows, rows

    def _tail_of(self, read: _Read, session_id: str, counter: str | None) -> Tail:
        if read is None:
            return empty_tail()
        row, system_rows, rows = read
        messages, offsets, counts = self._turn_rows(rows, SYSTEM_TURN, session_id, counter)
        system_tokens: Sequence[int | None] = ()
        if counter is not None:
            system_tokens = [self._count(t, counter, session_id) for _, t in system_rows]
        return Tail(
            tuple(self._decode(body, session_id) for body, _ in system_rows),
            messages,
            offsets,
            row.next_turn - row.first_turn,
            row.next_seq - row.first_seq + row.system_trimmed,
            counts if counter is not None else (),
            system_tokens,
            self._metadata(row.metadata, session_id),
            _cursor(row),
        )

    def _turn_rows(
        self, rows: Sequence[Any], previous: int, session_id: str, counter: str | None
    ) -> tuple[list[Message], list[int], list[int | None]]:
        """Turn rows ``(turn, body, tokens)`` as messages, the offsets where a turn starts
        (``previous``: the turn of the message before them) and the counts by ``counter``
        (all ``None`` without one)."""
        decode = self._decode
        messages = [decode(body, session_id) for _, body, _ in rows]
        offsets: list[int] = []
        for i, (turn, _, _) in enumerate(rows):
            if turn != previous:
                offsets.append(i)
                previous = turn
        if counter is None:
            return messages, offsets, [None] * len(rows)
        count = self._count
        return messages, offsets, [count(t, counter, session_id) for _, _, t in rows]

    def tail_since(
        self, session_id: str, cursor: object, counter: str | None = None
    ) -> Since | None:
        """What the session gained after ``cursor`` (a :attr:`Tail.cursor` or
        :attr:`Since.cursor` of this file): see :class:`~zerda.stores.Since`. One range of
        the primary key, the rows appended since."""
        check_session_id(session_id)
        if (
            type(cursor) is not tuple
            or len(cursor) != 4
            or not all(type(part) is int for part in cursor)
        ):
            return None  # not a cursor of this store
        sid, generation, end, turn = cursor
        with self._read("read what came since") as db:
            row = self._live(db, session_id)
            if (
                row is None
                or (row.sid, row.generation) != (sid, generation)
                or not row.first_seq <= end <= row.next_seq
            ):
                return None
            rows = (
                db.execute(_ROWS_SINCE, (sid, max(turn - 1, 0), end)).fetchall()
                if end < row.next_seq
                else []
            )
        if len(rows) != row.next_seq - end:
            return None  # a pinned message came (its row is not a turn's): read the tail
        # The message before the cursor belongs to turn ``turn - 1``.
        messages, starts, counts = self._turn_rows(rows, turn - 1, session_id, counter)
        return Since(
            messages,
            counts,
            starts,
            row.next_turn - row.first_turn,
            row.next_seq - row.first_seq + row.system_trimmed,
            _cursor(row),
        )

    def history(self, session_id: str) -> list[Message]:
        check_session_id(session_id)
        with self._read("read a history") as db:
            row = self._live(db, session_id)
            rows = db.execute(_ALL_ROWS, (row.sid,)).fetchall() if row is not None else []
        if row is None:
            return []
        # System messages come first in key order; put them back in place by position.
        split = 0
        while split < len(rows) and rows[split][0] == SYSTEM_TURN:
            split += 1
        ordered = heapq.merge(rows[:split], rows[split:], key=lambda r: r[1])
        # A whole session would flush the cache of the tails that memories read again.
        return [self._decode(body, session_id, remember=False) for _, _, body in ordered]

    def get_metadata(self, session_id: str) -> dict[str, Any]:
        check_session_id(session_id)
        with self._read("read metadata") as db:
            row = self._live(db, session_id)
        return {} if row is None else self._metadata(row.metadata, session_id)

    def _metadata(self, text: str, session_id: str) -> dict[str, Any]:
        return decode_metadata(text, self._where, session_id)

    def update_metadata(self, session_id: str, values: Mapping[str, Any]) -> None:
        copied = metadata_copy(values)
        check_session_id(session_id)
        with self._write("update metadata") as db:
            self._merge(db, session_id, copied)

    def compare_and_set(self, session_id: str, key: str, expected: Any, value: Any) -> bool:
        copied = metadata_copy({key: value}, reserved=True)
        wanted = metadata_copy({key: expected}, reserved=True)[key]
        check_session_id(session_id)
        with self._write("compare and set metadata") as db:
            row = self._live(db, session_id)
            current = None if row is None else self._metadata(row.metadata, session_id).get(key)
            if not same_json(current, wanted):
                return False
            self._merge(db, session_id, copied)
            return True

    def _merge(self, db: sqlite3.Connection, session_id: str, values: dict[str, Any]) -> None:
        """Merge checked ``values`` into the session's metadata, in a write transaction."""
        now = self._clock()
        row = self._writable(db, session_id, now)
        metadata = self._metadata(row.metadata, session_id)
        for key, value in values.items():
            if value is None:
                metadata.pop(key, None)
            else:
                metadata[key] = value
        text = json.dumps(metadata, ensure_ascii=False, separators=(",", ":"))
        db.execute(_SET_METADATA, (text, now, row.sid))

    def list_sessions(self) -> list[SessionInfo]:
        ttl = self.ttl
        with self._read("list sessions") as db:
            rows = db.execute(_LIST, (ttl, ttl, self._clock())).fetchall()
        return [
            SessionInfo(
                session_id,
                messages,
                turns,
                created_at,
                updated_at,
                None if ttl is None else updated_at + ttl,
            )
            for session_id, messages, turns, created_at, updated_at in rows
        ]

    def delete_session(self, session_id: str) -> bool:
        check_session_id(session_id)
        with self._write("delete a session") as db:
            row = self._session(db, session_id)
            if row is None:
                return False
            db.execute(_DROP_MESSAGES, (row.sid,))
            db.execute(_DROP_SESSION, (row.sid,))
            return not self._expired(row, self._clock())

    # -- editing the log (issue #16): each in one write transaction -------------------------

    def delete_messages(self, session_id: str, ids: Collection[str]) -> int:
        wanted = check_ids(ids)
        check_session_id(session_id)
        if not wanted:
            return 0
        with self._write("delete messages") as db:
            row = self._live(db, session_id)
            if row is None:
                return 0
            seqs = {seq for (seq,) in db.execute(_SEQS_OF_IDS, (row.sid, json.dumps(wanted)))}
            if not seqs:
                return 0  # nothing changed: not a write
            start = min((seq for seq in seqs if seq >= row.first_seq), default=None)
            self._rewrite(db, row, self._clock(), lambda _, seq: seq in seqs, start)
            return len(seqs)

    def pop_turn(self, session_id: str) -> list[Message]:
        check_session_id(session_id)
        with self._write("pop a turn") as db:
            row = self._live(db, session_id)
            if row is None or row.next_turn == row.first_turn:
                return []
            (start,) = db.execute(_TURN_START, (row.sid, row.next_turn - 1)).fetchone()
            # From the newest turn's start on, every row but the system ones is that turn's.
            bodies = self._rewrite(
                db, row, self._clock(), lambda turn, _: turn != SYSTEM_TURN, start
            )
        return [self._decode(body, session_id, remember=False) for body in bodies]

    def fork(self, session_id: str, new_session_id: str, at: str | None = None) -> int:
        check_session_id(new_session_id)
        check_session_id(session_id)
        with self._write("fork a session") as db:
            now = self._clock()
            source = self._live(db, session_id)
            end: int | None = None  # the last position copied (None: all of them)
            if at is not None:
                found = None
                if source is not None and isinstance(at, str):
                    found = db.execute(_BY_ID, (source.sid, at)).fetchone()
                if found is None:
                    raise message_not_found(session_id, at)
                end = found[1]
            target = self._session(db, new_session_id)
            if target is not None and not self._expired(target, now):
                held = target.next_seq - target.first_seq + target.system_trimmed
                if held or self._metadata(target.metadata, new_session_id):
                    raise session_exists(new_session_id)
            if source is None:
                return 0
            if target is None:
                sid = db.execute(_NEW_SESSION, (new_session_id, now, now, 0)).lastrowid
                assert sid is not None
            else:  # an expired or an empty session: started afresh
                sid = target.sid
                db.execute(_DROP_MESSAGES, (sid,))
            first = source.first_seq
            if end is None:
                end = source.next_seq
            trimmed = [
                seq
                for (seq,) in db.execute(_TRIMMED_SYSTEM, (source.sid, first)).fetchall()
                if seq <= end
            ]
            db.executemany(
                _COPY_TRIMMED, [(sid, i, source.sid, seq) for i, seq in enumerate(trimmed)]
            )
            shift = first - len(trimmed)
            copy = (sid, source.first_turn, shift, source.sid, first, end)
            copied = len(trimmed) + db.execute(_COPY_ROWS, copy).rowcount
            (next_turn,) = db.execute(_NEXT_TURN, (sid,)).fetchone()
            db.execute(_FORKED, (now, now, source.metadata, copied, next_turn, _generation(), sid))
            return copied

    def edit_message(
        self, session_id: str, message_id: str, content: str | tuple[Part, ...] | None
    ) -> Message:
        check_session_id(session_id)
        with self._write("edit a message") as db:
            row = self._live(db, session_id)
            found = None
            if row is not None and isinstance(message_id, str):
                found = db.execute(_BY_ID, (row.sid, message_id)).fetchone()
            if row is None or found is None:
                raise message_not_found(session_id, message_id)
            turn, seq, body = found
            now = self._clock()
            new = edited(self._decode(body, session_id), content, now)
            text = new.to_json()
            # The cache is keyed by stored text: the old text still decodes to the old message,
            # and no row holds it any more.
            db.execute(_EDIT_ROW, (text, row.sid, turn, seq))
            self._rewrite(db, row, now, lambda _, __: False, None)
        self._decoded.add([text], [new])
        return new

    def _rewrite(
        self,
        db: sqlite3.Connection,
        row: _Row,
        now: float,
        drop: Callable[[int, int], bool],
        start: int | None,
    ) -> list[str]:
        """Finish an edit of the log, in its write transaction: delete the rows that ``drop``
        picks (by turn and position), number what is left from ``start`` (the first position
        of the log the edit touches; ``None``: none) on as appending it would, and stamp the
        session written at ``now``. Returns the bodies of the rows dropped from ``start`` on,
        in order. The work is the rows from ``start`` on, plus the trimmed system rows.

        As in InMemoryStore, which rebuilds a session from its history, the system messages
        that retention kept ahead of the log join it again, just before its first message: a
        later trim counts them and may trim them again.
        """
        sid = row.sid
        first_seq, system_trimmed = row.first_seq, row.system_trimmed
        if system_trimmed:
            kept: list[int] = []
            for (seq,) in db.execute(_TRIMMED_SYSTEM, (sid, first_seq)).fetchall():
                if drop(SYSTEM_TURN, seq):
                    db.execute(_DROP_ROW, (sid, SYSTEM_TURN, seq))
                else:
                    kept.append(seq)
            first_seq -= len(kept)
            # Each moves up (or stays), to first_seq + i; highest first, onto freed places.
            moves = [(first_seq + i, sid, seq) for i, seq in enumerate(kept)]
            db.executemany(_MOVE_SYSTEM, [m for m in reversed(moves) if m[0] != m[2]])
            system_trimmed = 0
        next_seq, next_turn, first_turn = row.next_seq, row.next_turn, row.first_turn
        dropped: list[str] = []
        if start is not None:
            # Turns only grow with positions: walking the turn rows back from the newest meets
            # every row from start on, then the last row before it, whose turn goes on.
            later: list[Any] = []
            turn: int | None = None
            cursor = db.execute(_TURN_ROWS_BACK, (sid,))
            for r in cursor:
                if r[1] < start:
                    turn = r[0]
                    break
                later.append(r)
            cursor.close()
            later.reverse()
            system_rows = db.execute(_SYSTEM_ROWS_FROM, (sid, start)).fetchall()
            if system_rows:
                later = list(heapq.merge(later, system_rows, key=lambda r: r[1]))
            db.executemany(_DROP_ROW, [(sid, r[0], r[1]) for r in later])
            rows: list[tuple[object, ...]] = []
            for old_turn, old_seq, role, body, tokens, message_id in later:
                if drop(old_turn, old_seq):
                    dropped.append(body)
                    continue
                if role in _PINNED_ROLES:
                    at = SYSTEM_TURN
                else:
                    if role == "user" or turn is None:
                        turn = first_turn if turn is None else turn + 1
                    at = turn
                rows.append((sid, at, start + len(rows), role, body, tokens, message_id))
            db.executemany(_INSERT, rows)
            next_seq = start + len(rows)
            next_turn = first_turn if turn is None else turn + 1
        if next_turn == first_turn:  # no turn is left: number them from 0, as a new session
            next_turn = first_turn = 0
        db.execute(
            _AFTER_EDIT,
            (now, next_seq, first_seq, next_turn, first_turn, system_trimmed, _generation(), sid),
        )
        return dropped

    def clear(self) -> None:
        with self._write("clear") as db:
            db.execute("DELETE FROM messages")
            db.execute("DELETE FROM sessions")

    def purge_expired(self) -> int:
        if self.ttl is None:
            return 0
        with self._write("purge expired sessions") as db:
            sids = db.execute(_EXPIRED, (self.ttl, self._clock())).fetchall()
            for sid in sids:
                db.execute(_DROP_MESSAGES, sid)
                db.execute(_DROP_SESSION, sid)
            return len(sids)


def _encode_counts(given: TokenCounts, n: int) -> list[str | None]:
    """Each message's counts as a JSON object (``None`` when the batch has none); the counts
    are ints, as check_batch made sure."""
    if not given:
        return [None] * n
    if len(given) == 1:
        # The common case, one counter: format the objects directly rather than via dumps.
        ((name, counts),) = given.items()
        key = json.dumps(name, ensure_ascii=False)
        return [f"{{{key}:{c}}}" for c in counts]
    items = list(given.items())
    return [json.dumps({name: counts[i] for name, counts in items}) for i in range(n)]


def _locked(exc: sqlite3.OperationalError) -> bool:
    """Whether sqlite3 refused for a lock another connection holds (SQLITE_BUSY/LOCKED)."""
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)  # type: ignore[attr-defined]
    return "locked" in str(exc)


class AsyncSQLiteStore(ThreadedAsync, AsyncClosingStore):
    """The async protocol over a SQLite file, never blocking the event loop.

    Each store owns one worker thread that runs every sqlite3 call (through a
    :class:`SQLiteStore`, so the SQL is the same), and the connection never leaves it. The
    file is opened by the first call, in that thread: errors about the file (see
    :class:`SQLiteStore`) come from the first ``await``, while bad options raise here.
    Close with ``await store.aclose()`` or ``async with``.

    It has no sync methods on purpose: a memory over it uses its async methods natively, and
    its sync methods say to use the async ones.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        ttl: float | None = None,
        max_messages: int | None = None,
        clock: Callable[[], float] = time.time,
        timeout: float = 30.0,
    ) -> None:
        check_retention(ttl, max_messages)
        self.path = _check_path(path)
        self.ttl = ttl
        self.max_messages = max_messages
        self.timeout = check_timeout(timeout, zero=True)
        self._clock = clock
        self._store: SQLiteStore | None = None
        self._closed = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zerda-sqlite")

    def __repr__(self) -> str:
        return f"AsyncSQLiteStore({self.path!r})"

    def _threaded(self) -> SQLiteStore:
        """The sync store, opened on first use (in the worker thread)."""
        if self._store is None:
            self._store = SQLiteStore(
                self.path,
                ttl=self.ttl,
                max_messages=self.max_messages,
                clock=self._clock,
                timeout=self.timeout,
            )
        return self._store

    async def _in_thread(self, call: Callable[[Store], _T]) -> _T:
        if self._closed:
            raise StoreUnavailableError(f"SQLite store {self.path!r} is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: call(self._threaded()))

    async def aschema_version(self) -> int:
        """How many schema migrations the file has had (opens it if needed)."""
        return await self._in_thread(lambda s: self._threaded().schema_version)

    async def aclose(self) -> None:
        """Close the file and stop the worker thread; later calls raise. Idempotent."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        try:
            # Queued behind any call still running, which may be the one opening the file.
            await loop.run_in_executor(self._executor, self._close_opened)
        finally:
            self._executor.shutdown(wait=False)

    def _close_opened(self) -> None:
        if self._store is not None:
            self._store.close()

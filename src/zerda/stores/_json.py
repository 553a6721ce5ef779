"""The JSON file store: every session in one JSON document, replaced atomically on each write."""

from __future__ import annotations

import errno
import json
import os
import re
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

from zerda.errors import ConfigurationError, CorruptDataError, StoreUnavailableError, ZerdaError
from zerda.messages import Message
from zerda.parts import Part
from zerda.stores._base import (
    ClosingStore,
    SessionInfo,
    Since,
    Tail,
    ThreadedAsync,
    TokenCounts,
    check_batch,
    check_ids,
    check_retention,
    check_session_id,
    metadata_copy,
)
from zerda.stores._memory import InMemoryStore, _restore_session, _Session, _session_state

try:
    import fcntl
except ImportError:  # Windows: see _process_lock
    fcntl = None  # type: ignore[assignment]

__all__ = ["JSONFileStore"]

FORMAT = "zerda-json"
VERSION = 1

_T = TypeVar("_T")
_HEAD = f'{{"format":"{FORMAT}","version":{VERSION},"sessions":{{\n'.encode()
_TAIL = b"\n}}\n"
_DOCUMENT_KEYS = frozenset({"format", "version", "sessions"})
_SESSION_KEYS = frozenset({"created_at", "updated_at", "metadata", "messages", "tokens"})
_TOKEN_BYTES = 16
_NO_FILE = (-1, -1, -1, -1)

# Without fcntl, stores of one process over one file share a lock from here; nothing guards
# the file against other processes then.
_PROCESS_LOCKS: dict[str, threading.Lock] = {}
_PROCESS_LOCKS_GUARD = threading.Lock()


def _process_lock(key: str) -> threading.Lock:
    with _PROCESS_LOCKS_GUARD:
        return _PROCESS_LOCKS.setdefault(key, threading.Lock())


class JSONFileStore(ThreadedAsync, ClosingStore):
    """Every session in one JSON file you can read: for small deployments, fixtures and tests.

    It behaves exactly like :class:`~zerda.stores.InMemoryStore` (which does the work on a
    copy of the file's contents held in memory) and persists each write by rewriting the whole
    file: a temporary file in the same folder, flushed and ``fsync``-ed, renamed over ``path``
    (``os.replace``), then the folder ``fsync``-ed. A process killed at any point leaves the
    old file or the new one, never a torn one; a temporary file it leaves behind is ignored,
    and deleted by the next writer.

    Stores, threads and processes may share the file: each write is a read-modify-write under
    an exclusive ``fcntl.flock`` on the sidecar ``path + ".lock"`` (reads take it shared), and
    a store reloads the file whenever another one has replaced it. Where ``fcntl`` does not
    exist (Windows), the lock only covers the stores of one process.

    Reads are served from memory once the file is loaded, but each write rewrites the whole
    file (encoding only what changed), and a store reads it whole again after another store
    wrote: keep it for modest amounts of data, and use :class:`~zerda.stores.SQLiteStore`
    beyond that (many writers, long sessions). A file that cannot be decoded raises
    :class:`~zerda.errors.CorruptDataError` naming it, and is never written over. A missing
    file is an empty store; the first write creates it, and any missing parent folders.

    The document::

        {"format": "zerda-json", "version": 1, "sessions": {
          "<session id>": {"created_at": <epoch s>, "updated_at": <epoch s>, "metadata": {...},
                           "tokens": {"<counter name>": [<count or null per message>, ...]},
                           "messages": [<Message.to_dict()>, ...]}}}

    ``messages`` is the session's ``history()``, one message per line; ``tokens`` has one
    column per counter, aligned with it. Its async methods run the sync ones in a worker
    thread, as the file I/O blocks.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        ttl: float | None = None,
        max_messages: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
        if not isinstance(path, str) or not path:
            raise ConfigurationError(f"path must be a file path (str or os.PathLike), got {path!r}")
        check_retention(ttl, max_messages)
        self.path = path
        self.ttl = ttl
        self.max_messages = max_messages
        self._file = Path(path)
        self._lock_path = path + ".lock"
        self._key = os.path.normcase(os.path.realpath(path))
        # Stale temporary files are ours by name: ".<file name>.<pid>.<8 hex>.tmp".
        self._temp_name = re.compile(rf"\.{re.escape(self._file.name)}\.\d+\.[0-9a-f]{{8}}\.tmp")
        # The sessions as of the last load or write; InMemoryStore applies every operation.
        self._mem = InMemoryStore(ttl=ttl, max_messages=max_messages, clock=clock)
        # Each session's JSON as this store last wrote it: a write encodes again only the
        # sessions it changes, and only their new messages (the codec knows the others).
        self._encoded: dict[str, bytes] = {}
        self._codec = _Codec()
        # What the loaded state came from: the file's (dev, ino, size, mtime_ns) and the write
        # token in the lock file, which every writer changes before it replaces the file (a
        # replaced file can reuse an inode within one mtime tick). None: reload.
        self._seen: tuple[int, int, int, int] | None = None
        self._token = b""
        self._lock = threading.Lock()
        self._lock_fd: int | None = None
        self._lock_fd_writable = False
        self._lock_fd_pid = 0
        self._swept = False
        self._closed = False

    def __repr__(self) -> str:
        return f"JSONFileStore({self.path!r})"

    # -- the contract ---------------------------------------------------------------------------

    def append(
        self, session_id: str, messages: Sequence[Message], tokens: TokenCounts | None = None
    ) -> int:
        check_session_id(session_id)
        check_batch(messages, tokens)
        _check_counts(tokens)
        return self._write(session_id, lambda mem: mem.append(session_id, messages, tokens))

    def append_then_tail(
        self,
        session_id: str,
        messages: Sequence[Message],
        tokens: TokenCounts | None,
        turns: int | None,
        counter: str | None = None,
    ) -> tuple[int, Tail]:
        check_session_id(session_id)
        check_batch(messages, tokens)
        _check_counts(tokens)
        return self._write(
            session_id,
            lambda mem: mem.append_then_tail(session_id, messages, tokens, turns, counter),
        )

    def tail(self, session_id: str, turns: int | None, counter: str | None = None) -> Tail:
        # The file is read whole anyway (only when another store changed it); the tail itself
        # is cut from memory at the cost of what it returns.
        return self._read(lambda mem: mem.tail(session_id, turns, counter))

    def tail_since(
        self, session_id: str, cursor: object, counter: str | None = None
    ) -> Since | None:
        # A reload (another store changed the file) makes new sessions, so older cursors go
        # stale: the caller reads the tail again.
        return self._read(lambda mem: mem.tail_since(session_id, cursor, counter))

    def history(self, session_id: str) -> list[Message]:
        return self._read(lambda mem: mem.history(session_id))

    def get_metadata(self, session_id: str) -> dict[str, Any]:
        return self._read(lambda mem: mem.get_metadata(session_id))

    def update_metadata(self, session_id: str, values: Mapping[str, Any]) -> None:
        check_session_id(session_id)
        copied = metadata_copy(values)
        self._write(session_id, lambda mem: mem.update_metadata(session_id, copied))

    def compare_and_set(self, session_id: str, key: str, expected: Any, value: Any) -> bool:
        check_session_id(session_id)
        metadata_copy({key: value}, reserved=True)  # refuse a bad value before the lock
        return self._write(
            session_id,
            lambda mem: mem.compare_and_set(session_id, key, expected, value),
            save=bool,
        )

    def list_sessions(self) -> list[SessionInfo]:
        return self._read(lambda mem: mem.list_sessions())

    def delete_session(self, session_id: str) -> bool:
        check_session_id(session_id)
        return self._write(None, lambda mem: mem.delete_session(session_id), save=bool)

    # Editing the log: InMemoryStore edits the state just loaded, under the exclusive lock,
    # and the file is rewritten only when something changed. On a store with no folder yet
    # there is nothing to edit, and nothing is created.

    def delete_messages(self, session_id: str, ids: Collection[str]) -> int:
        wanted = check_ids(ids)
        check_session_id(session_id)
        return self._write(
            session_id,
            lambda mem: mem.delete_messages(session_id, wanted),
            save=bool,
            create=False,
        )

    def pop_turn(self, session_id: str) -> list[Message]:
        check_session_id(session_id)
        return self._write(
            session_id, lambda mem: mem.pop_turn(session_id), save=bool, create=False
        )

    def fork(self, session_id: str, new_session_id: str, at: str | None = None) -> int:
        check_session_id(new_session_id)
        check_session_id(session_id)
        # The new session is the one that changes (a fork copies nothing when it returns 0).
        return self._write(
            new_session_id,
            lambda mem: mem.fork(session_id, new_session_id, at),
            save=bool,
            create=False,
        )

    def edit_message(
        self, session_id: str, message_id: str, content: str | tuple[Part, ...] | None
    ) -> Message:
        check_session_id(session_id)
        return self._write(
            session_id, lambda mem: mem.edit_message(session_id, message_id, content), create=False
        )

    def clear(self) -> None:
        # Clearing a store with no file creates none.
        self._write(None, lambda mem: mem.clear(), save=lambda _: self._seen != _NO_FILE)

    def purge_expired(self) -> int:
        return self._write(None, lambda mem: mem.purge_expired(), save=bool)

    def close(self) -> None:
        """Release the lock file; later calls raise :class:`~zerda.StoreUnavailableError`."""
        with self._lock:
            self._closed = True
            if self._lock_fd is not None:
                fd, self._lock_fd = self._lock_fd, None
                os.close(fd)
            self._mem.clear()
            self._encoded, self._codec = {}, _Codec()
            self._seen = None

    # -- one operation: lock, reload if the file changed, apply, save ----------------------------

    def _read(self, operation: Callable[[InMemoryStore], _T]) -> _T:
        with self._lock, self._locked(exclusive=False):
            self._reload()
            return operation(self._mem)

    def _write(
        self,
        session_id: str | None,
        operation: Callable[[InMemoryStore], _T],
        save: Callable[[_T], bool] = lambda _: True,
        *,
        create: bool = True,
    ) -> _T:
        """Apply ``operation`` to the file's current state and replace the file with the result.

        ``session_id`` names the session the operation changes (its JSON is encoded again);
        operations without one only remove sessions. ``create=False`` says the operation
        changes nothing in an empty store: with no folder, it runs on one and creates nothing.
        ``save`` says from the result whether anything changed.
        """
        with self._lock:
            if (session_id is None or not create) and not self._file.parent.is_dir():
                # No folder, so no file: nothing to remove, and no folder to create for it.
                self._check_open()
                self._install({}, _NO_FILE, self._token)
                return operation(self._mem)
            with self._locked(exclusive=True):
                return self._apply(session_id, operation, save)

    def _apply(
        self,
        session_id: str | None,
        operation: Callable[[InMemoryStore], _T],
        save: Callable[[_T], bool],
    ) -> _T:
        """The body of :meth:`_write`, under both locks."""
        self._reload()
        try:
            if session_id is not None:
                self._encoded.pop(session_id, None)
            result = operation(self._mem)
            if save(result):
                self._save()
        except BaseException:
            # The state in memory may be ahead of the file: load the file again next time.
            self._seen = None
            raise
        return result

    # -- the lock ---------------------------------------------------------------------------

    @contextmanager
    def _locked(self, *, exclusive: bool) -> Iterator[None]:
        fd = self._open_lock_file(exclusive)
        if fcntl is None or fd is None:
            # No fcntl, or a read where the lock file cannot be made (a read-only or missing
            # folder): readers are safe without it, as the file is only ever replaced whole.
            with _process_lock(self._key):
                yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        except OSError as exc:  # ENOLCK: a network file system without locks
            raise self._unavailable("lock it", exc) from exc
        try:
            if exclusive and not self._swept:
                self._sweep()
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def _open_lock_file(self, for_write: bool) -> int | None:
        """The lock file's descriptor, opened once per store and process.

        ``None`` when a read cannot open it (the folder is missing or read-only).
        """
        self._check_open()
        fd = self._lock_fd
        if fd is not None and self._lock_fd_pid != os.getpid():
            # A forked child shares its parent's open file, and so its flock: open our own.
            os.close(fd)
            fd = self._lock_fd = None
        if fd is not None and (self._lock_fd_writable or not for_write):
            return fd
        try:
            if for_write:
                self._file.parent.mkdir(parents=True, exist_ok=True)
            new = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o666)
            writable = True
        except OSError as exc:
            if for_write:
                raise self._unavailable("create its lock file", exc) from exc
            try:
                new = os.open(self._lock_path, os.O_RDONLY)
            except OSError:
                return fd
            writable = False
        if fd is not None:
            os.close(fd)
        self._lock_fd, self._lock_fd_writable, self._lock_fd_pid = new, writable, os.getpid()
        return new

    def _check_open(self) -> None:
        if self._closed:
            raise StoreUnavailableError(f"JSON file store {self.path!r} is closed")

    def _read_token(self) -> bytes:
        fd = self._lock_fd
        if fd is None:
            return b""
        os.lseek(fd, 0, os.SEEK_SET)
        return os.read(fd, _TOKEN_BYTES)

    def _new_token(self) -> bytes:
        """Mark the file as about to change, for every store that has loaded it."""
        assert self._lock_fd is not None  # a write opened it writable
        token = os.urandom(_TOKEN_BYTES)
        os.lseek(self._lock_fd, 0, os.SEEK_SET)
        os.write(self._lock_fd, token)
        return token

    def _sweep(self) -> None:
        """Delete temporary files left by killed writers (every live one holds the lock)."""
        self._swept = True
        with suppress(OSError), os.scandir(self._file.parent) as entries:
            for entry in entries:
                if self._temp_name.fullmatch(entry.name):
                    with suppress(OSError):
                        os.unlink(entry.path)

    # -- reading and writing the file ------------------------------------------------------

    def _reload(self) -> None:
        """Load the file into ``self._mem`` unless it is what was loaded or written last."""
        try:
            token = self._read_token()
        except OSError as exc:
            raise self._unavailable("read its lock file", exc) from exc
        try:
            with open(self._file, "rb") as f:
                st = os.fstat(f.fileno())
                seen = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
                if seen == self._seen and token == self._token:
                    return
                data = f.read()
        except FileNotFoundError:
            self._install({}, _NO_FILE, token)
            return
        except OSError as exc:
            raise self._unavailable("read it", exc) from exc
        self._install(self._decode(data), seen, token)

    def _install(
        self,
        sessions: dict[str, _Session],
        seen: tuple[int, int, int, int],
        token: bytes,
    ) -> None:
        self._mem._sessions = sessions
        self._encoded = {}
        self._seen, self._token = seen, token
        self._codec.prune(sessions.values())

    def _save(self) -> None:
        """Write the state in memory to the file, atomically."""
        sessions = self._mem._sessions
        encoded: dict[str, bytes] = {}
        parts: list[bytes] = []
        for session_id in sorted(sessions):
            data = self._encoded.get(session_id)
            if data is None:
                data = _encode_session(sessions[session_id], self._codec)
            encoded[session_id] = data
            parts.append(b'"%s":%s' % (session_id.encode(), data))  # ids are plain ASCII
        try:
            token = self._new_token()
            seen = self._replace(_HEAD + b",\n".join(parts) + _TAIL)
        except OSError as exc:
            raise self._unavailable("write it", exc) from exc
        self._encoded = encoded
        self._seen, self._token = seen, token
        self._codec.prune(sessions.values())

    def _replace(self, data: bytes) -> tuple[int, int, int, int]:
        """Write ``data`` to a temporary file and rename it over the file; its signature."""
        folder = self._file.parent
        temp = folder / f".{self._file.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        try:
            try:
                with suppress(FileNotFoundError):  # keep the permissions the file has
                    mode = os.stat(self._file).st_mode & 0o7777
                    if hasattr(os, "fchmod"):
                        os.fchmod(fd, mode)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
                st = os.fstat(fd)
            finally:
                os.close(fd)
            os.replace(temp, self._file)
        except BaseException:
            with suppress(OSError):
                os.unlink(temp)
            raise
        if os.name == "posix":
            # The rename is durable only once the folder is on disk too.
            dir_fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOTSUP):  # a file system without it
                    raise
            finally:
                os.close(dir_fd)
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def _unavailable(self, doing: str, exc: OSError) -> StoreUnavailableError:
        return StoreUnavailableError(f"JSON file store {self.path!r}: cannot {doing}: {exc}")

    # -- decoding -----------------------------------------------------------------------------

    def _decode(self, data: bytes) -> dict[str, _Session]:
        """The sessions of a document; CorruptDataError saying what is wrong with it."""
        try:
            document = json.loads(data, parse_constant=_no_constant)
        except (ValueError, RecursionError) as exc:
            raise self._corrupt(f"it is not JSON ({exc})") from exc
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise self._corrupt(f'it is not a Zerda JSON store (no "format": "{FORMAT}")')
        if document.get("version") != VERSION:
            raise self._corrupt(
                f"its format version is {document.get('version')!r}; "
                f"this Zerda reads version {VERSION}"
            )
        unknown = document.keys() - _DOCUMENT_KEYS
        raw = document.get("sessions")
        if unknown or not isinstance(raw, dict):
            raise self._corrupt(
                f"unknown keys {sorted(unknown)}" if unknown else '"sessions" is not an object'
            )
        sessions: dict[str, _Session] = {}
        for session_id, value in raw.items():
            try:
                check_session_id(session_id)
                sessions[session_id] = _decode_session(value, self._codec)
            except (ZerdaError, ValueError, TypeError, RecursionError) as exc:
                raise self._corrupt(f"session {session_id[:60]!r}: {exc}") from exc
        return sessions

    def _corrupt(self, why: str) -> CorruptDataError:
        return CorruptDataError(
            f"JSON file store {self.path!r} cannot be read: {why}; the file was left as it is"
        )


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def _dumps(value: Any) -> bytes:
    # Messages and metadata hold valid Unicode only (they are checked), so UTF-8 never fails.
    return _ENCODE(value).encode()


def _layout(head: dict[str, Any], messages: Sequence[bytes]) -> bytes:
    """A session's JSON: its fields, then its messages one per line (easy to read and diff)."""
    if not messages:
        return _dumps({**head, "messages": []})
    return _dumps(head)[:-1] + b',"messages":[\n' + b",\n".join(messages) + b"\n]}"


class _Codec:
    """Messages and their JSON, both ways, so that each message is encoded or decoded once.

    ``lines`` maps ``id(message)`` to the message, its JSON and its key (holding the message
    keeps the id its own). ``messages`` maps a key, the ``repr`` of a message's dict form, to
    the message: for parsed JSON values, equal reprs mean equal values (``repr`` tells
    ``1``, ``1.0`` and ``True`` apart and round-trips floats), and equal dicts decode to equal
    messages. ``repr`` is as fast as the C encoder and faster than a second ``Message``.
    """

    __slots__ = ("lines", "messages")

    def __init__(self) -> None:
        self.lines: dict[int, tuple[Message, bytes, str]] = {}
        self.messages: dict[str, Message] = {}

    def encode(self, messages: Sequence[Message]) -> list[bytes]:
        lines = self.lines
        out: list[bytes] = []
        for m, hit in zip(messages, map(lines.get, map(id, messages)), strict=True):
            if hit is None:
                data = m.to_dict()
                line, key = _dumps(data), repr(data)
                lines[id(m)] = (m, line, key)
                self.messages.setdefault(key, m)
                out.append(line)
            else:
                out.append(hit[1])
        return out

    def decode(self, raw: Sequence[Any]) -> list[Message]:
        known = self.messages
        out: list[Message] = []
        for i, data in enumerate(raw):
            key = repr(data)
            m = known.get(key)
            if m is None:
                try:
                    m = Message.from_dict(data)
                except ZerdaError as exc:
                    raise ValueError(f"message {i}: {exc}") from exc
                known[key] = m
                self.lines[id(m)] = (m, _dumps(data), key)
            out.append(m)
        return out

    def prune(self, sessions: Iterable[_Session]) -> None:
        """Forget the messages no session holds any more, once they are as many as the rest."""
        sessions = list(sessions)
        held = sum(s.message_count for s in sessions)
        if len(self.lines) <= 2 * held + 1024:
            return
        old = self.lines
        self.lines = {}
        for session in sessions:
            for m in (*session.system[: session.system_trimmed], *session.messages):
                hit = old.get(id(m))
                if hit is not None:
                    self.lines[id(m)] = hit
        self.messages = {key: m for m, _, key in self.lines.values()}


def _encode_session(session: _Session, codec: _Codec) -> bytes:
    messages, tokens = _session_state(session)
    head = {
        "created_at": session.created_at,
        "updated_at": session.updated_at,
        "metadata": session.metadata,
        "tokens": tokens,
    }
    return _layout(head, codec.encode(messages))


def _decode_session(value: object, codec: _Codec) -> _Session:
    """A session from its JSON; ValueError (or a ZerdaError) saying what is wrong."""
    if not isinstance(value, dict):
        raise ValueError(f"a session is an object, got {type(value).__name__}")
    unknown = value.keys() - _SESSION_KEYS
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)}")
    created_at = _seconds(value.get("created_at"), "created_at")
    updated_at = _seconds(value.get("updated_at"), "updated_at")
    metadata = metadata_copy(value.get("metadata", {}), reserved=True)
    raw_messages = value.get("messages")
    if not isinstance(raw_messages, list):
        raise ValueError('"messages" is not a list')
    messages = codec.decode(raw_messages)
    tokens = value.get("tokens", {})
    if not isinstance(tokens, dict):
        raise ValueError('"tokens" is not an object')
    for name, counts in tokens.items():
        if (
            not isinstance(counts, list)
            or len(counts) != len(messages)
            or not set(map(type, counts)) <= _COUNT_TYPES
        ):
            raise ValueError(
                f"token counts by {name!r} must be one int or null per message ({len(messages)})"
            )
    return _restore_session(created_at, updated_at, metadata, messages, tokens)


_COUNT_TYPES = {int, type(None)}  # exact types: bool is not a count


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_counts(tokens: TokenCounts | None) -> None:
    """Refuse counts that are not ints: written, they would make the file unreadable."""
    for name, counts in (tokens or {}).items():
        if not isinstance(name, str):
            raise ConfigurationError(f"a counter name is a string, got {name!r}")
        for count in counts:
            if not _is_count(count):
                raise ConfigurationError(f"token counts by {name!r} must be ints, got {count!r}")


def _seconds(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be epoch seconds, got {value!r}")
    return float(value)

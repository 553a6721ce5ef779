"""What each ``zerda`` command does, over any store that implements the Store protocol."""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from zerda import formats
from zerda.cli import _replay
from zerda.cli._chat import cmd_chat
from zerda.cli._context import (
    Layout,
    Row,
    TurnRows,
    context_json,
    context_turns,
    inspect_context,
    print_context,
    print_messages,
    print_pinned,
    print_turn,
    system_rows,
)
from zerda.cli._jsonl import MAX_PROBLEMS, Parsed, parse_jsonl
from zerda.cli._render import (
    SHORT_ID,
    clip,
    local_time,
    plural,
    short_id,
    size,
    table,
)
from zerda.cli._serve import cmd_keys, cmd_mcp, cmd_serve
from zerda.errors import InvalidSessionIdError, ZerdaError
from zerda.memory import (
    BaseMemory,
    ConversationBufferMemory,
    ConversationBufferWindowMemory,
    ConversationTokenBufferMemory,
    Inspection,
)
from zerda.memory._record import SUMMARY_KEY
from zerda.messages import Message, Role, group_turns, stamp_batch
from zerda.stores._base import (
    KEY_SESSION_PREFIX,
    SessionInfo,
    Store,
    Tail,
    check_session_id,
    redact,
)
from zerda.stores._open import StoreTarget, open_store, parse_target
from zerda.tokens import TokenCounter, counter_by_name, message_counts

__all__ = ["COMMANDS", "Context"]

# psycopg's pool logs every failed connection attempt as a warning, which Python prints on
# stderr when nothing is configured; a command reports the failure itself, in one line.
logging.getLogger("psycopg.pool").addHandler(logging.NullHandler())


@dataclass(slots=True)
class Context:
    """What every command gets besides its arguments: the store target and where to write."""

    target: str
    source: str  # where the target came from: "--db", "$ZERDA_DB", "the default location"
    json: bool
    out: TextIO
    err: TextIO

    @property
    def where(self) -> StoreTarget:
        return parse_target(self.target)

    @property
    def shown(self) -> str:
        """The target as it may be printed: any password in a URL masked."""
        return redact(self.target)


# -- opening the store -----------------------------------------------------------------------


@contextmanager
def _reading(ctx: Context) -> Iterator[Store | None]:
    """The store, or ``None`` when its file does not exist: reading never creates a file."""
    where = ctx.where
    if where.path is not None and not where.path.exists():
        yield None
        return
    store = open_store(ctx.target)
    try:
        yield store
    finally:
        store.close()


@contextmanager
def _writing(ctx: Context) -> Iterator[Store]:
    """The store, created if need be (file stores create missing folders too)."""
    store = open_store(ctx.target)
    try:
        yield store
    finally:
        store.close()


def _missing(ctx: Context, session_id: str) -> ZerdaError:
    exists = ctx.where.path is None or ctx.where.path.exists()
    where = ctx.shown if exists else f"{ctx.shown} (the file does not exist yet)"
    return ZerdaError(f"no session {session_id!r} in {where}; 'zerda sessions' lists them")


def _require(store: Store | None, ctx: Context, session_id: str) -> Store:
    """``store``, if it holds the session (messages or metadata), else the missing error."""
    if store is None:
        raise _missing(ctx, session_id)
    if store.tail(session_id, 0).total_messages == 0 and not store.get_metadata(session_id):
        raise _missing(ctx, session_id)
    return store


def _emit_json(ctx: Context, value: object) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False), file=ctx.out)


# -- sessions --------------------------------------------------------------------------------


def _session_json(info: SessionInfo) -> dict[str, Any]:
    return {
        "session_id": info.session_id,
        "messages": info.messages,
        "turns": info.turns,
        "created_at": info.created_at,
        "updated_at": info.updated_at,
        "expires_at": info.expires_at,
    }


def cmd_sessions(args: argparse.Namespace, ctx: Context) -> int:
    with _reading(ctx) as store:
        listed = store.list_sessions() if store is not None else []
    # The API keys of zerda serve live in sessions of their own: 'zerda keys list' shows them.
    infos = [s for s in listed if not s.session_id.startswith(KEY_SESSION_PREFIX)]
    # Newest first; the sort is stable, so sessions active at the same time stay in id order.
    infos.sort(key=lambda s: s.updated_at, reverse=True)
    if ctx.json:
        _emit_json(ctx, [_session_json(s) for s in infos])
    elif not infos:
        print(f"No sessions in {ctx.shown}.", file=ctx.out)
    else:
        rows: list[Sequence[object]] = [("session", "messages", "turns", "last activity")]
        rows += [(s.session_id, s.messages, s.turns, local_time(s.updated_at)) for s in infos]
        for line in table(rows, "lrrl"):
            print(line, file=ctx.out)
    return 0


# -- show ------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Session:
    """A whole session as rows with token counts."""

    total_messages: int
    total_turns: int
    system: list[Row]
    turns: list[TurnRows]


def _whole_session(store: Store, session_id: str, counter: TokenCounter) -> _Session:
    tail = store.tail(session_id, None, counter.name)
    system_counts = message_counts(counter, tail.system, tail.system_tokens)
    system = [Row(m, n) for m, n in zip(tail.system, system_counts, strict=True)]
    counts = message_counts(counter, tail.messages, tail.tokens)
    first_number = tail.total_turns - len(tail.turn_starts) + 1
    bounds = [*tail.turn_starts, len(tail.messages)]
    turns = [
        TurnRows(first_number + i, [Row(tail.messages[j], counts[j]) for j in range(begin, end)])
        for i, (begin, end) in enumerate(itertools.pairwise(bounds))
    ]
    return _Session(tail.total_messages, tail.total_turns, system, turns)


def _context(
    store: Store, args: argparse.Namespace, counter: TokenCounter
) -> tuple[Inspection, dict[str, Any]]:
    """What the memory the options describe sends to the model: its inspection, and what
    the header and footer say of the memory."""
    memory: BaseMemory[Any]
    settings: dict[str, Any]
    if args.k is not None:
        memory = ConversationBufferWindowMemory(k=args.k, store=store, session_id=args.session)
        settings = {"memory": "ConversationBufferWindowMemory", "k": args.k}
    else:
        memory = ConversationTokenBufferMemory(
            max_token_limit=args.token_limit,
            reserve_tokens=args.reserve,
            token_counter=counter,
            store=store,
            session_id=args.session,
        )
        settings = {
            "memory": "ConversationTokenBufferMemory",
            "max_token_limit": args.token_limit,
            "reserve_tokens": args.reserve,
            "budget": memory.budget,
        }
    return inspect_context(memory, counter), settings


def _print_session(
    ctx: Context, session_id: str, view: _Session, counter: TokenCounter, whole_ids: bool
) -> None:
    out = ctx.out
    print(
        f"Session {session_id}: {plural(view.total_messages, 'message')} in "
        f"{plural(view.total_turns, 'turn')} (tokens by {counter.name})",
        file=out,
    )
    layout = Layout.of([*view.system, *(r for t in view.turns for r in t.rows)], whole_ids)
    print_pinned(out, view.system, sum(r.tokens for r in view.system), layout)
    for turn in view.turns:
        print_turn(out, turn, view.total_turns, layout)
    if not view.system and not view.turns:
        print("\nNo messages.", file=out)


_FORMATS: dict[str, Callable[[list[Message]], object]] = {
    "openai": formats.to_openai,
    "responses": formats.to_responses,
    "anthropic": formats.to_anthropic,
    "gemini": formats.to_gemini,
}


def cmd_show(args: argparse.Namespace, ctx: Context) -> int:
    with _reading(ctx) as opened:
        store = _require(opened, ctx, args.session)
        counter = counter_by_name(args.counter)
        inspection: Inspection | None = None
        session: _Session | None = None
        if args.context:
            inspection, settings = _context(store, args, counter)
            if inspection.error is not None:
                raise ZerdaError(
                    f"{inspection.error}; try a larger --token-limit"
                ) from inspection.error
            messages = list(inspection.context)
        elif args.format is not None:  # every turn, repaired: one read, no token rows
            messages = ConversationBufferMemory(store=store, session_id=args.session).get_context()
        else:
            session = _whole_session(store, args.session, counter)
    if args.format is not None:
        print(
            json.dumps(_FORMATS[args.format](messages), indent=2, ensure_ascii=False),
            file=ctx.out,
        )
        return 0
    if inspection is not None:
        if not ctx.json:
            print_context(ctx.out, args.session, inspection, settings, whole_ids=args.ids)
            return 0
        stored = inspection.stats
        _emit_json(
            ctx,
            {
                "session_id": args.session,
                "counter": counter.name,
                "total_messages": stored["stored_messages"],
                "total_turns": stored["stored_turns"],
                "system": [r.as_json() for r in system_rows(inspection)],
                "turns": [t.as_json() for t in context_turns(inspection)],
                "context": context_json(inspection, settings),
            },
        )
        return 0
    assert session is not None  # no --context, no --format: the whole session was read
    if not ctx.json:
        _print_session(ctx, args.session, session, counter, args.ids)
        return 0
    _emit_json(
        ctx,
        {
            "session_id": args.session,
            "counter": counter.name,
            "total_messages": session.total_messages,
            "total_turns": session.total_turns,
            "system": [r.as_json() for r in session.system],
            "turns": [t.as_json() for t in session.turns],
        },
    )
    return 0


# -- export ----------------------------------------------------------------------------------


def cmd_export(args: argparse.Namespace, ctx: Context) -> int:
    with _reading(ctx) as opened:
        store = _require(opened, ctx, args.session)
        messages = store.history(args.session)
    lines = (m.to_dict() if args.full else m.to_openai() for m in messages)
    # JSONL is UTF-8 whatever the terminal's encoding.
    data = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in lines).encode("utf-8")
    if args.output is None or args.output == "-":
        buffer = getattr(ctx.out, "buffer", None)
        if buffer is not None:
            ctx.out.flush()
            buffer.write(data)
            buffer.flush()
        else:
            ctx.out.write(data.decode("utf-8"))
        return 0
    Path(args.output).write_bytes(data)
    form = "full" if args.full else "openai"
    if ctx.json:
        _emit_json(
            ctx,
            {
                "session_id": args.session,
                "messages": len(messages),
                "format": form,
                "output": args.output,
            },
        )
    else:
        what = "with metadata and times" if args.full else "in OpenAI format"
        print(
            f"Exported {plural(len(messages), 'message')} of session {args.session} "
            f"to {args.output} ({what}).",
            file=ctx.out,
        )
    return 0


# -- import ----------------------------------------------------------------------------------


def _read_input(name: str) -> tuple[bytes, str]:
    if name == "-":
        return sys.stdin.buffer.read(), "<stdin>"
    return Path(name).read_bytes(), name


def _parse(ctx: Context, data: bytes, name: str, done: str) -> Parsed:
    """The file's messages; else each bad line as ``FILE:LINE: reason``, and ``nothing {done}``."""
    parsed = parse_jsonl(data, name)
    if parsed.problems:
        for problem in parsed.problems:
            print(f"zerda: error: {problem}", file=ctx.err)
        hidden = parsed.bad_lines - len(parsed.problems)
        more = f" ({hidden} more not shown)" if hidden else ""
        bad = plural(parsed.bad_lines, "bad line")
        raise ZerdaError(f"nothing {done}: {bad} in {name}{more}")
    if parsed.form is None or not parsed.messages:
        raise ZerdaError(f"{name} holds no messages; nothing {done}")
    return parsed


def cmd_import(args: argparse.Namespace, ctx: Context) -> int:
    if args.session_prefix is not None:
        problem = None
        if args.session_field is None:
            problem = "--session-prefix goes with --session-field"
        elif args.session_prefix and not _valid_session_id(args.session_prefix):
            problem = (
                f"argument --session-prefix: {args.session_prefix!r} cannot start a session "
                "id: 1 to 200 of A-Z a-z 0-9 _ . : @ + = -"
            )
        if problem is not None:
            print(f"zerda: error: {problem} (see 'zerda import --help')", file=ctx.err)
            return 2
    data, name = _read_input(args.file)
    parsed = _parse(ctx, data, name, "imported")
    if args.session_field is not None:
        return _import_by_field(args, ctx, parsed, name)
    # Stamped as memories stamp them: every message stored has a time and an id. Messages that
    # come with ids (an export --full) and are in the session already are skipped.
    batch = stamp_batch(parsed.messages, time.time())
    with _writing(ctx) as store:
        stored = store.append(args.session, batch)
        after = store.tail(args.session, 0)
    turns = len(group_turns(batch))
    if ctx.json:
        _emit_json(
            ctx,
            {
                "session_id": args.session,
                "source": name,
                "form": parsed.form,
                "conversations": parsed.conversations,
                "messages": len(batch),
                "stored": stored,
                "turns": turns,
                "session_messages": after.total_messages,
                "session_turns": after.total_turns,
            },
        )
        return 0
    form = parsed.form_name  # _parse refuses a file without messages
    if parsed.form == "conversations":
        form = f"{plural(parsed.conversations, 'conversation')}, {form}"
    skipped = len(batch) - stored
    what = f"{plural(len(batch), 'message')} ({plural(turns, 'turn')})"
    if skipped:  # messages with ids (an export --full) the session holds: stored once
        what = f"{stored} of {what}"
    held = f"; {skipped} had an id the session holds already" if skipped else ""
    print(
        f"Imported {what} from {name} ({form}) into session {args.session}, which now holds "
        f"{plural(after.total_messages, 'message')} in {plural(after.total_turns, 'turn')}{held}.",
        file=ctx.out,
    )
    return 0


def _valid_session_id(value: str) -> bool:
    try:
        check_session_id(value)
    except InvalidSessionIdError:
        return False
    return True


def _session_of(record: dict[str, Any], key: str, prefix: str, number: int) -> str:
    """The session conversation ``number`` goes to by ``--session-field key``, else why not."""
    if key not in record:
        keys = ", ".join(repr(k) for k in sorted([*record, "messages"]))
        raise ZerdaError(
            f"conversation {number} has no {key!r} to name its session; its keys: {keys}"
        )
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, str | int):
        kind = "null" if value is None else f"a JSON {type(value).__name__}"
        raise ZerdaError(
            f"conversation {number}: {key!r} is {kind}; a session is named by a string or a "
            "whole number"
        )
    session = f"{prefix}{value}"
    try:
        return check_session_id(session)
    except InvalidSessionIdError as exc:
        raise ZerdaError(f"conversation {number}: {key!r} makes no session id: {exc}") from None


def _import_by_field(args: argparse.Namespace, ctx: Context, parsed: Parsed, name: str) -> int:
    """Each conversation into the session its field names: every conversation checked first,
    then one atomic batch a session, in the order the sessions first appear."""
    key, prefix = args.session_field, args.session_prefix or ""
    if parsed.form != "conversations":
        raise ZerdaError(
            f'--session-field needs conversations ({{"messages": [...]}}, one a line or in a '
            f"JSON array); {name} holds {parsed.form_name}; nothing imported"
        )
    problems = []
    sessions: dict[str, list[Message]] = {}
    conversations: dict[str, int] = {}
    spans = parsed.spans()
    for number, ((start, end), record, line) in enumerate(
        zip(spans, parsed.records, parsed.conversation_lines, strict=True), 1
    ):
        try:
            session = _session_of(record, key, prefix, number)
        except ZerdaError as exc:
            problems.append(f"{name}:{line}: {exc}")
            continue
        sessions.setdefault(session, []).extend(parsed.messages[start:end])
        conversations[session] = conversations.get(session, 0) + 1
    if problems:
        for problem in problems[:MAX_PROBLEMS]:
            print(f"zerda: error: {problem}", file=ctx.err)
        hidden = len(problems) - MAX_PROBLEMS
        more = f" ({hidden} more not shown)" if hidden > 0 else ""
        bad = plural(len(problems), "conversation")
        raise ZerdaError(
            f"nothing imported: {bad} of {len(spans)} in {name} without a session name by "
            f"--session-field {key}{more}"
        )
    now = time.time()
    done: list[dict[str, Any]] = []
    with _writing(ctx) as store:
        for session, messages in sessions.items():
            if not messages:
                continue  # conversations with no messages: no session to create
            batch = stamp_batch(messages, now)
            try:
                stored = store.append(session, batch)
                after = store.tail(session, 0)
            except (ZerdaError, OSError, ValueError, sqlite3.Error) as exc:
                if not done:
                    raise
                raise ZerdaError(
                    f"{exc} (importing into session {session}; the {plural(len(done), 'session')} "
                    "before it were imported, each in full)"
                ) from exc
            done.append(
                {
                    "session_id": session,
                    "conversations": conversations[session],
                    "messages": len(batch),
                    "stored": stored,
                    "turns": len(group_turns(batch)),
                    "session_messages": after.total_messages,
                    "session_turns": after.total_turns,
                }
            )
    messages_in = sum(s["messages"] for s in done)
    stored_in = sum(s["stored"] for s in done)
    turns = sum(s["turns"] for s in done)
    if ctx.json:
        _emit_json(
            ctx,
            {
                "source": name,
                "form": parsed.form,
                "conversations": parsed.conversations,
                "messages": messages_in,
                "stored": stored_in,
                "turns": turns,
                "session_field": key,
                "session_prefix": prefix,
                "sessions": done,
            },
        )
        return 0
    skipped = messages_in - stored_in
    what = f"{plural(messages_in, 'message')} ({plural(turns, 'turn')})"
    if skipped:
        what = f"{stored_in} of {what}"
    held = f"; {skipped} had an id their session holds already" if skipped else ""
    names = ", ".join(s["session_id"] for s in done[:3])
    if len(done) > 3:
        names += f" and {len(done) - 3:,} more"
    form = f"{plural(parsed.conversations, 'conversation')}, {parsed.form_name}"
    print(
        f"Imported {what} from {name} ({form}) into {plural(len(done), 'session')} named by "
        f"{key!r}: {names}{held}.",
        file=ctx.out,
    )
    return 0


# -- replay ----------------------------------------------------------------------------------


def _settings(args: argparse.Namespace) -> list[_replay.Setting]:
    """A setting per value of --k or --token-limit, in the order given, each once."""
    values = args.k if args.memory == "window" else args.token_limit
    settings = []
    for value in dict.fromkeys(values):
        if args.memory == "window":
            settings.append(_replay.Setting("window", k=value))
        else:
            settings.append(_replay.Setting(args.memory, token_limit=value, reserve=args.reserve))
    return settings


def cmd_replay(args: argparse.Namespace, ctx: Context) -> int:
    if args.log_scale and args.plot is None:
        print(
            "zerda: error: --log-scale goes with --plot FILE (see 'zerda replay --help')",
            file=ctx.err,
        )
        return 2
    # What can fail fast does, before a long file is read and replayed.
    if args.plot is not None:
        _replay.check_plot(args.plot)
    counter = counter_by_name(args.counter)
    data, name = _read_input(args.file)
    parsed = _parse(ctx, data, name, "replayed")
    return _replay.run_command(
        parsed,
        name,
        _settings(args),
        counter,
        out=ctx.out,
        err=ctx.err,
        as_json=ctx.json,
        per_turn=args.per_turn,
        plot=args.plot,
        one_session=args.as_one_session,
        log_scale=args.log_scale,
    )


# -- stats -----------------------------------------------------------------------------------


def _store_stats(ctx: Context) -> dict[str, Any]:
    where = ctx.where
    stats: dict[str, Any] = {"target": ctx.shown, "source": ctx.source, "backend": where.backend}
    if where.path is not None:
        stats["path"] = str(where.path)
        stats["exists"] = where.path.exists()
        if stats["exists"]:
            stats["file_size"] = where.path.stat().st_size
            wal = where.path.with_name(where.path.name + "-wal")
            if wal.exists():
                stats["wal_size"] = wal.stat().st_size
    with _reading(ctx) as store:
        infos = store.list_sessions() if store is not None else []
        version = getattr(store, "schema_version", None)
        if callable(version):
            version = version()
    if version is not None:
        stats["schema_version"] = version
    stats["sessions"] = len(infos)
    stats["messages"] = sum(s.messages for s in infos)
    stats["turns"] = sum(s.turns for s in infos)
    return stats


def _session_stats(ctx: Context, session_id: str, counter: TokenCounter) -> dict[str, Any]:
    with _reading(ctx) as opened:
        store = _require(opened, ctx, session_id)
        tail = store.tail(session_id, None, counter.name)
        info = next((s for s in store.list_sessions() if s.session_id == session_id), None)
    by_role: dict[str, dict[str, int]] = {role.value: {"messages": 0, "tokens": 0} for role in Role}
    for messages, stored in ((tail.system, tail.system_tokens), (tail.messages, tail.tokens)):
        for m, n in zip(messages, message_counts(counter, messages, stored), strict=True):
            by_role[m.role.value]["messages"] += 1
            by_role[m.role.value]["tokens"] += n
    return {
        "session_id": session_id,
        "messages": tail.total_messages,
        "turns": tail.total_turns,
        "created_at": info.created_at if info else None,
        "updated_at": info.updated_at if info else None,
        "expires_at": info.expires_at if info else None,
        "counter": counter.name,
        "tokens_by_role": by_role,
        "tokens": sum(r["tokens"] for r in by_role.values()),
    }


def cmd_stats(args: argparse.Namespace, ctx: Context) -> int:
    if args.session is not None:
        stats = _session_stats(ctx, args.session, counter_by_name(args.counter))
        if ctx.json:
            _emit_json(ctx, stats)
            return 0
        rows: list[Sequence[object]] = [
            ("session", stats["session_id"]),
            ("messages", stats["messages"]),
            ("turns", stats["turns"]),
            ("first activity", local_time(stats["created_at"])),
            ("last activity", local_time(stats["updated_at"])),
        ]
        if stats["expires_at"] is not None:
            rows.append(("expires", local_time(stats["expires_at"])))
        for line in table(rows, "ll"):
            print(line, file=ctx.out)
        print(f"\nTokens by {stats['counter']}:", file=ctx.out)
        by_role = stats["tokens_by_role"]
        role_rows: list[Sequence[object]] = [("role", "messages", "tokens")]
        role_rows += [(role, v["messages"], v["tokens"]) for role, v in by_role.items()]
        role_rows.append(("total", stats["messages"], stats["tokens"]))
        for line in table(role_rows, "lrr", indent="  "):
            print(line, file=ctx.out)
        return 0
    stats = _store_stats(ctx)
    if ctx.json:
        _emit_json(ctx, stats)
        return 0
    rows = [
        ("database", f"{stats['target']} (from {stats['source']})"),
        ("backend", stats["backend"]),
    ]
    if "path" in stats:
        if not stats["exists"]:
            rows.append(("file", "does not exist yet ('zerda import' creates it)"))
        else:
            rows.append(("file size", size(stats["file_size"])))
            if stats.get("wal_size"):
                rows.append(("write-ahead log", size(stats["wal_size"])))
    if "schema_version" in stats:
        rows.append(("schema version", stats["schema_version"]))
    rows += [
        ("sessions", stats["sessions"]),
        ("messages", stats["messages"]),
        ("turns", stats["turns"]),
    ]
    for line in table(rows, "ll"):
        print(line, file=ctx.out)
    return 0


# -- rm --------------------------------------------------------------------------------------


def cmd_rm(args: argparse.Namespace, ctx: Context) -> int:
    if args.messages:
        return _rm_messages(args, ctx)
    with _reading(ctx) as opened:
        store = _require(opened, ctx, args.session)
        before = store.tail(args.session, 0)
        if not store.delete_session(args.session):
            raise _missing(ctx, args.session)  # removed by someone else meanwhile
    if ctx.json:
        _emit_json(
            ctx,
            {
                "session_id": args.session,
                "removed": True,
                "messages": before.total_messages,
                "turns": before.total_turns,
            },
        )
    else:
        print(
            f"Removed session {args.session}: {plural(before.total_messages, 'message')} in "
            f"{plural(before.total_turns, 'turn')}, and its metadata.",
            file=ctx.out,
        )
    return 0


# -- editing: rm --message, pop, edit, fork --------------------------------------------------


def _editor(store: Store, session_id: str) -> BaseMemory[Any]:
    """The memory that edits a session, so that the memories' rules apply: a deleted call
    takes its results with it, and a summary that covered what an edit changes is dropped
    (every memory does that; a summary memory folds the turns again on its next write)."""
    return ConversationBufferMemory(store=store, session_id=session_id)


def _summary_text(store: Store, session_id: str) -> str:
    raw = store.get_metadata(session_id).get(SUMMARY_KEY)
    text = raw.get("text") if isinstance(raw, dict) else None
    return text if isinstance(text, str) else ""


def _resolve(
    session_id: str, history: Sequence[Message], given: Sequence[str], nothing: str
) -> list[str]:
    """The whole ids of the messages ``given`` names, each named by its whole id or by the
    end ``zerda show`` prints (at least :data:`SHORT_ID` characters that end one id of the
    session only); else one error for every id that names none, and ``nothing`` was done."""
    ids = [m.id for m in history if m.id is not None]
    held = set(ids)
    found: list[str] = []
    unknown: list[str] = []
    ambiguous: list[str] = []
    for wanted in dict.fromkeys(given):
        if wanted in held:
            found.append(wanted)
            continue
        ends = [i for i in ids if i.endswith(wanted)] if len(wanted) >= SHORT_ID else []
        if len(ends) == 1:
            found.append(ends[0])
        else:
            (ambiguous if ends else unknown).append(wanted)
    problems = []
    if unknown:
        names = ", ".join(repr(clip(u, 80)) for u in unknown)
        noun = "message" if len(unknown) == 1 else "messages"
        problems.append(f"session {session_id!r} holds no {noun} {names}")
    if ambiguous:
        names = ", ".join(repr(a) for a in ambiguous)
        problems.append(f"more than one id of session {session_id!r} ends with {names}")
    if problems:
        raise ZerdaError(
            f"{'; '.join(problems)}; nothing {nothing} ('zerda show {session_id} --ids' "
            "prints the whole ids)"
        )
    return list(dict.fromkeys(found))


def _with_results(history: Sequence[Message], ids: Sequence[str]) -> tuple[list[Message], int]:
    """The messages deleting ``ids`` deletes, in log order: those, and the tool results of
    the calls they make; and how many of them are such results, not named."""
    named = set(ids)
    calls = {c.id for m in history if m.id in named for c in m.tool_calls}
    gone = [
        m
        for m in history
        if m.id in named or (m.role is Role.TOOL and m.tool_call_id in calls and m.id is not None)
    ]
    return gone, sum(m.id not in named for m in gone)


def _left(ctx: Context, session_id: str, after: Tail, summary_dropped: bool) -> None:
    """The lines after an edit: what the session holds now, and whether its summary went."""
    print(
        f"Session {session_id} now holds {plural(after.total_messages, 'message')} in "
        f"{plural(after.total_turns, 'turn')}.",
        file=ctx.out,
    )
    if summary_dropped:
        print(
            "Its summary covered what changed: it is dropped, and a summary memory folds the "
            "turns again on its next write.",
            file=ctx.out,
        )


def _rm_messages(args: argparse.Namespace, ctx: Context) -> int:
    session = args.session
    with _reading(ctx) as opened:
        store = _require(opened, ctx, session)
        history = store.history(session)
        named = _resolve(session, history, args.messages, "deleted")
        gone, results = _with_results(history, named)
        summary = _summary_text(store, session)
        deleted = _editor(store, session).delete_messages(named)
        after = store.tail(session, 0)
        dropped = bool(summary) and not _summary_text(store, session)
    if ctx.json:
        _emit_json(
            ctx,
            {
                "session_id": session,
                "deleted": deleted,
                "named": named,
                "tool_results": results,
                "messages": [m.to_dict() for m in gone],
                "summary_dropped": dropped,
                "session_messages": after.total_messages,
                "session_turns": after.total_turns,
            },
        )
        return 0
    went = f" ({plural(results, 'tool result')} of a deleted call went with it)" if results else ""
    print(f"Deleted {plural(deleted, 'message')} from session {session}{went}:", file=ctx.out)
    print_messages(ctx.out, gone)
    _left(ctx, session, after, dropped)
    return 0


def cmd_pop(args: argparse.Namespace, ctx: Context) -> int:
    session = args.session
    with _reading(ctx) as opened:
        store = _require(opened, ctx, session)
        summary = _summary_text(store, session)
        before = store.tail(session, 0)
        turn = _editor(store, session).pop_turn()
        if turn is None:
            held = before.total_messages
            what = (
                f"only {plural(held, 'system or developer message')}, which belong to no turn"
                if held
                else "only metadata"
            )
            raise ZerdaError(f"nothing to pop: session {session!r} holds no turn, {what}")
        after = store.tail(session, 0)
        dropped = bool(summary) and not _summary_text(store, session)
    number = after.total_turns + 1  # the newest turn was the one after those left
    if ctx.json:
        _emit_json(
            ctx,
            {
                "session_id": session,
                "turn": number,
                "messages": [m.to_dict() for m in turn.messages],
                "summary_dropped": dropped,
                "session_messages": after.total_messages,
                "session_turns": after.total_turns,
            },
        )
        return 0
    print(
        f"Popped turn {number} from session {session}: {plural(len(turn.messages), 'message')}.",
        file=ctx.out,
    )
    print_messages(ctx.out, turn.messages)
    _left(ctx, session, after, dropped)
    return 0


def _content(value: str) -> str:
    """The text of ``--content``: ``-`` reads standard input (UTF-8), less one final newline."""
    if value != "-":
        return value
    data = sys.stdin.buffer.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ZerdaError(
            f"standard input is not UTF-8 text ({exc.reason} at byte {exc.start}); nothing changed"
        ) from None
    return text.removesuffix("\n").removesuffix("\r")


def cmd_edit(args: argparse.Namespace, ctx: Context) -> int:
    session = args.session
    content = _content(args.content)
    with _reading(ctx) as opened:
        store = _require(opened, ctx, session)
        (message_id,) = _resolve(session, store.history(session), [args.message], "changed")
        summary = _summary_text(store, session)
        message = _editor(store, session).edit_message(message_id, content)
        dropped = bool(summary) and not _summary_text(store, session)
    if ctx.json:
        _emit_json(
            ctx,
            {"session_id": session, "message": message.to_dict(), "summary_dropped": dropped},
        )
        return 0
    print(f"Edited message {short_id(message_id)} of session {session}:", file=ctx.out)
    print_messages(ctx.out, [message])
    if dropped:
        print(
            "The session's summary covered it: it is dropped, and a summary memory folds the "
            "turns again on its next write.",
            file=ctx.out,
        )
    return 0


def cmd_fork(args: argparse.Namespace, ctx: Context) -> int:
    session, new = args.session, args.new
    with _reading(ctx) as opened:
        store = _require(opened, ctx, session)
        at = None
        if args.at is not None:
            (at,) = _resolve(session, store.history(session), [args.at], "forked")
        _editor(store, session).fork(new, at)
        after = store.tail(new, 0)
    if ctx.json:
        _emit_json(
            ctx,
            {
                "session_id": session,
                "new_session_id": new,
                "at": at,
                "messages": after.total_messages,
                "turns": after.total_turns,
            },
        )
        return 0
    upto = f", up to and including message {short_id(at)}" if at is not None else ""
    print(
        f"Forked session {session} into {new}{upto}: {new} holds "
        f"{plural(after.total_messages, 'message')} in {plural(after.total_turns, 'turn')}.",
        file=ctx.out,
    )
    return 0


# -- migrate ---------------------------------------------------------------------------------


def _sqlite_version(path: Path) -> int:
    """How many migrations a SQLite file has had, read without changing it (0: none yet)."""
    if not path.exists():
        return 0
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            (count,) = db.execute("SELECT count(*) FROM _zerda_migrations").fetchone()
        finally:
            db.close()
    except sqlite3.Error:
        return 0  # no migrations table yet; or not a database, which opening it reports
    return int(count)


def _migrate(ctx: Context) -> tuple[int, int] | None:
    """Migrate the store: its versions (before, after), or ``None`` if it has no schema."""
    where = ctx.where
    if where.backend == "sqlite":
        from zerda.stores._sqlite import SQLiteStore

        assert where.path is not None
        before = _sqlite_version(where.path)
        with SQLiteStore(where.path) as store:  # opening migrates
            return before, store.schema_version
    with _writing(ctx) as store:
        migrate = getattr(store, "migrate", None)
        if not callable(migrate):
            return None
        before, after = migrate()
        return int(before), int(after)


def cmd_migrate(args: argparse.Namespace, ctx: Context) -> int:
    target = ctx.shown
    backend = ctx.where.backend
    versions = _migrate(ctx)
    if ctx.json:
        before, after = versions if versions is not None else (None, None)
        _emit_json(
            ctx,
            {
                "target": target,
                "backend": backend,
                "schema": versions is not None,
                "version_before": before,
                "version_after": after,
                "applied": 0 if versions is None else versions[1] - versions[0],
            },
        )
    elif versions is None:
        print(f"Nothing to migrate: the {backend} store {target} has no schema.", file=ctx.out)
    elif versions[0] == versions[1]:
        print(f"Schema of {target}: version {versions[1]}, already up to date.", file=ctx.out)
    else:
        applied = plural(versions[1] - versions[0], "migration")
        print(
            f"Schema of {target}: version {versions[0]} -> {versions[1]} ({applied} applied).",
            file=ctx.out,
        )
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace, Context], int]] = {
    "sessions": cmd_sessions,
    "show": cmd_show,
    "export": cmd_export,
    "import": cmd_import,
    "stats": cmd_stats,
    "rm": cmd_rm,
    "pop": cmd_pop,
    "edit": cmd_edit,
    "fork": cmd_fork,
    "migrate": cmd_migrate,
    "replay": cmd_replay,
    "chat": cmd_chat,
    "serve": cmd_serve,
    "keys": cmd_keys,
    "mcp": cmd_mcp,
}

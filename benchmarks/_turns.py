"""What the store benchmarks share: cutting sessions into turns, the memories, a timed turn."""

from __future__ import annotations

import gc
import itertools
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from zerda import Message, TiktokenCounter, Turn
from zerda.memory import (
    BaseMemory,
    ConversationBufferWindowMemory,
    ConversationSummaryBufferMemory,
    ConversationTokenBufferMemory,
)
from zerda.stores import InMemoryStore
from zerda.stores._base import TokenCounts

BUDGET = 2000
WINDOW = 10
KINDS = {"token": f"TokenBuffer({BUDGET})", "window": f"Window(k={WINDOW})"}


def disk_bytes(path: Path) -> int:
    """The bytes a SQLite database at ``path`` takes on disk, its ``-wal`` and ``-shm`` files
    included."""
    return sum(f.stat().st_size for f in path.parent.glob(path.name + "*"))


def split(turns: Sequence[Turn], size: int) -> tuple[list[Turn], list[Turn]]:
    """Whole turns holding at least ``size`` messages, and the turns after them."""
    cut = seen = 0
    while seen < size:
        seen += len(turns[cut].messages)
        cut += 1
    return list(turns[:cut]), list(turns[cut:])


def preceding(turns: Sequence[Turn], end: int, size: int) -> list[Turn]:
    """The whole turns just before ``turns[end]`` that hold at least ``size`` messages."""
    start = end
    seen = 0
    while seen < size:
        start -= 1
        seen += len(turns[start].messages)
    return list(turns[start:end])


def flatten(turns: Sequence[Turn], stamp: float) -> list[Message]:
    return [m.with_created_at(stamp) for t in turns for m in t.messages]


def make_memory(
    kind: str, store: Any, counter: TiktokenCounter, session_id: str = "bench"
) -> BaseMemory:
    """The token memory (``"token"``) or the window memory (``"window"``) over ``store``."""
    if kind == "token":
        return ConversationTokenBufferMemory(
            BUDGET, token_counter=counter, store=store, session_id=session_id
        )
    return ConversationBufferWindowMemory(k=WINDOW, store=store, session_id=session_id)


def summary_cases(
    store: Any, turns: Sequence[Turn], counter: TiktokenCounter
) -> list[tuple[str, Callable[[], object]]]:
    """What a summary buffer memory costs in round trips: a write with nothing to fold, a read,
    and a turn of a session whose budget is full (each write folds what it pushed out: one
    store call for the write, and per fold one compare-and-set and one read).

    The memories are warmed up first (the full one filled until it has folded), so that only
    the calls of the case are counted. Messages without ids get new ones at every write, so
    turns taken again from ``turns`` are new turns.
    """
    quiet = ConversationSummaryBufferMemory(
        10**9, token_counter=counter, store=store, session_id="summary-quiet"
    )
    quiet.add_messages(turns[0].messages)
    full = ConversationSummaryBufferMemory(
        BUDGET, token_counter=counter, store=store, session_id="summary-full"
    )
    supply = itertools.cycle(turns)
    while full.get_memory_stats()["turns_summarized"] == 0:
        full.add_messages(next(supply).messages)
    question = Message("user", "One more flat white, please.")
    return [
        ("SummaryBuffer add_message, nothing to fold", lambda: quiet.add_message(question)),
        ("SummaryBuffer get_context", quiet.get_context),
        (
            f"SummaryBuffer({BUDGET}) turn, budget full (add_messages, folds as due)",
            lambda: full.add_messages(next(supply).messages),
        ),
    ]


def time_turns(memory: BaseMemory, timed: Sequence[Turn]) -> tuple[float, int]:
    """Seconds per turn of ``add_messages`` + ``get_context``, and the last context's length."""
    # The benchmark holds the prefilled sessions in memory; keep the garbage collector from
    # walking them during the timed loop, which would charge their size to the store.
    gc.collect()
    gc.freeze()
    add, get = memory.add_messages, memory.get_context
    start = time.perf_counter()
    for turn in timed:
        add(turn.messages)
        get()
    elapsed = time.perf_counter() - start
    return elapsed / len(timed), len(get())


def time_in_memory(
    kind: str,
    log: Sequence[Message],
    counts: TokenCounts,
    counter: TiktokenCounter,
    timed: Sequence[Turn],
) -> float:
    """Seconds per turn of the same turns over an ``InMemoryStore`` holding the same session:
    the reference each store is compared with."""
    reference = InMemoryStore()
    reference.append("run", list(log), counts)
    seconds, _ = time_turns(make_memory(kind, reference, counter, "run"), timed)
    return seconds


def print_turn_table(rows: Sequence[Any], store: str, field: str) -> dict[str, float]:
    """Print the per-turn rows (``field`` holds the store's µs per turn) as a markdown table,
    then, per memory, the time at the largest session over the time at the smallest; return
    those ratios."""
    print(
        f"| memory | messages in session | {store} µs/turn | in-memory µs/turn | context messages |"
    )
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r.memory} | {r.messages_in_session:,} | {getattr(r, field)} | {r.in_memory_us} "
            f"| {r.context_messages} |"
        )
    ratios: dict[str, float] = {}
    print()
    for label in KINDS.values():
        same = [r for r in rows if r.memory == label]
        ratios[label] = round(getattr(same[-1], field) / getattr(same[0], field), 2)
        print(
            f"- {label}: per turn at {same[-1].messages_in_session:,} / at "
            f"{same[0].messages_in_session:,} messages = {ratios[label]}"
        )
    return ratios

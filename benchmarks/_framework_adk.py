"""Google ADK's SqliteSessionService beside ZerdaSessionService over a SQLiteStore.

A turn is what ADK's ``Runner`` does with its session service around one invocation: load the
session (``get_session``, with the ``RunConfig``'s ``get_session_config``), then append each
event of the turn through the session it loaded (the user's message, the model's calls, the
tools' responses, the answer). ``SqliteSessionService`` is the service ADK's CLI uses for a
local database (``sqlite:///`` URIs and ``.adk/session.db``). By default the runner loads
every event of the session; the second row of each size passes both services
``GetSessionConfig(num_recent_events=RECENT)``, which ADK's service runs as a ``LIMIT`` query
and Zerda's as a read of the newest turns. Each side's service is made once before the timed
turns, as a server keeps it; the garbage collector is kept from walking the events the
benchmark holds while a side is timed.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _sessions import session_dicts
from _turns import disk_bytes, split

from zerda import Message, group_turns

NAME = "Google ADK"
RECENT = 50
"""The events a run loads in the second row (``GetSessionConfig(num_recent_events=RECENT)``)."""


def _events(messages: Sequence[Message]) -> list[Any]:
    """The ADK events of ``messages``, as a runner records them: a user message, a model
    response with its calls, and the responses to a response's calls in one event."""
    from google.adk.events.event import Event
    from google.genai import types

    names: dict[str, str] = {}
    out: list[Any] = []
    responses: list[Any] = []

    def flush() -> None:
        if responses:
            content = types.Content(role="user", parts=list(responses))
            out.append(Event(invocation_id="bench", author="barista", content=content))
            responses.clear()

    for m in messages:
        if m.role.value == "tool":
            response = types.FunctionResponse(
                id=m.tool_call_id,
                name=names.get(m.tool_call_id or "", "tool"),
                response={"result": m.text},
            )
            responses.append(types.Part(function_response=response))
            continue
        flush()
        if m.role.value == "user":
            content = types.Content(role="user", parts=[types.Part(text=m.text)])
            out.append(Event(invocation_id="bench", author="user", content=content))
            continue
        parts: list[Any] = [types.Part(text=m.text)] if m.text else []
        for call in m.tool_calls:
            names[call.id] = call.name
            function_call = types.FunctionCall(
                id=call.id, name=call.name, args=_args(call.arguments)
            )
            parts.append(types.Part(function_call=function_call))
        content = types.Content(role="model", parts=parts)
        out.append(Event(invocation_id="bench", author="barista", content=content))
    flush()
    return out


def _args(arguments: str) -> dict[str, Any]:
    """A call's arguments as ``FunctionCall.args``: their JSON object (the text itself where
    the data set's JSON is broken)."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {"input": arguments}
    return value if isinstance(value, dict) else {"input": value}


def _turn_events(n_messages: int, turns: int) -> tuple[int, list[Any], list[list[Any]]]:
    """How many messages the first ``n_messages`` messages (whole turns) are, their events,
    and the next ``turns`` turns' events, each a list."""
    all_turns = group_turns(Message.from_openai(d) for d in session_dicts(n_messages + 40 * turns))
    prefill, after = split(all_turns, n_messages)
    timed = [_events(t.messages) for t in after[:turns]]
    assert len(timed) == turns, "the data set ran out of turns"
    messages = [m for t in prefill for m in t.messages]
    return len(messages), _events(messages), timed


async def _fill(service: Any, events: list[Any]) -> None:
    session = await service.create_session(app_name="bench", user_id="u", session_id="s")
    for event in events:
        await service.append_event(session, event)


async def _turns(service: Any, timed: list[list[Any]], config: Any) -> float:
    """Seconds per turn of the runner's session work over ``timed``."""
    copies = [[event.model_copy(deep=True) for event in events] for events in timed]
    gc.collect()
    gc.freeze()
    try:
        start = time.perf_counter()
        for events in copies:
            session = await service.get_session(
                app_name="bench", user_id="u", session_id="s", config=config
            )
            for event in events:
                await service.append_event(session, event)
        return (time.perf_counter() - start) / len(timed)
    finally:
        gc.unfreeze()


async def _measure(n: int, turns: int, directory: Path, recent: bool) -> dict[str, object]:
    from google.adk.sessions.base_session_service import GetSessionConfig
    from google.adk.sessions.sqlite_session_service import SqliteSessionService

    from zerda.integrations.adk import ZerdaSessionService
    from zerda.stores import SQLiteStore

    size, prefill, timed = _turn_events(n, turns)
    config = GetSessionConfig(num_recent_events=RECENT) if recent else None
    tag = "recent" if recent else "all"

    adk_path = directory / f"adk-{n}-{tag}.db"
    adk = SqliteSessionService(str(adk_path))
    await _fill(adk, prefill)
    adk_before = disk_bytes(adk_path)
    adk_seconds = await _turns(adk, timed, config)
    adk_bytes = round((disk_bytes(adk_path) - adk_before) / turns)

    zerda_path = directory / f"zerda-{n}-{tag}.db"
    store = SQLiteStore(zerda_path)
    await _fill(ZerdaSessionService(store), prefill)
    store.close()
    zerda_before = disk_bytes(zerda_path)
    store = SQLiteStore(zerda_path)
    zerda_seconds = await _turns(ZerdaSessionService(store), timed, config)
    store.close()

    loads = f"num_recent_events={RECENT}" if recent else "every event"
    return {
        "framework": f"{NAME} ({RECENT} recent events)" if recent else NAME,
        "baseline": f"SqliteSessionService, get_session loads {loads}",
        "zerda": f"ZerdaSessionService (SQLiteStore), get_session loads {loads}",
        "messages": size,
        "baseline_us": round(adk_seconds * 1e6),
        "zerda_us": round(zerda_seconds * 1e6),
        "baseline_bytes": adk_bytes,
        "zerda_bytes": round((disk_bytes(zerda_path) - zerda_before) / turns),
    }


def measure(sizes: Sequence[int], turns: int, directory: Path) -> list[dict[str, object]]:
    """Two rows per size: the runner's per-turn session work loading every event, then the
    newest ``RECENT``; and bytes stored per turn."""
    logging.getLogger("google_adk").setLevel(logging.ERROR)
    return [
        asyncio.run(_measure(n, turns, directory, recent))
        for recent in (False, True)
        for n in sizes
    ]

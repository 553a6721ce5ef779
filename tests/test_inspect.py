"""``memory.inspect()``: one account of the context, for every memory kind (issue #28).

The state machine in ``test_accounting.py`` checks that an inspection agrees with the text
of every context it meets; these tests pin what each part says in the cases a reader looks
for: a moved result, a removed call, an orphan, a greeting, a cut text, a renamed id, a
summary, a failing summarizer, a context over the budget.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import pytest

from zerda import ApproxCounter, ConfigurationError, ContextOverflowError, Message
from zerda.memory import (
    BaseMemory,
    ConversationBufferMemory,
    ConversationBufferWindowMemory,
    ConversationSummaryBufferMemory,
    ConversationTokenBufferMemory,
    Inspection,
)
from zerda.stores import InMemoryStore

COUNTER = ApproxCounter()


def call(*ids: str, text: str | None = None) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": text,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": "look", "arguments": "{}"}}
            for i in ids
        ],
    }


def result(call_id: str, text: str = "found") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def reply(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def repairs_of(inspection: Inspection) -> list[tuple[str, str, str | None]]:
    """(the message's text or role, the repair's kind, its call id) for every repair."""
    return [
        (a.message.text or a.message.role.value, r.kind, r.call_id)
        for t in inspection.turns
        for a in t.messages
        for r in a.repairs
    ]


def consistent(memory: BaseMemory[Any], inspection: Inspection) -> None:
    """What every inspection must say of itself and of the memory's other answers."""
    context, stats = memory.get_context_with_stats()
    assert list(inspection.context) == context
    # (A read of a failing summarizer tries again, and counts the failure.)
    assert {**inspection.stats, "summary_failures": 0} == {**stats, "summary_failures": 0}
    fates = [t.fate for t in inspection.turns]
    assert {f: fates.count(f) for f in set(fates)} == {
        f: n for f, n in inspection.fates().items() if n
    }
    assert sum(inspection.fates().values()) == stats["stored_turns"]
    assert sum(t.sent_tokens for t in inspection.turns) == inspection.tokens.turns
    if "context_tokens" in stats:
        assert inspection.tokens.total == stats["context_tokens"]
        assert dataclasses.asdict(inspection.tokens) | {"reply_priming": 0, "budget": 0} == {
            **stats["tokens_by_part"],
            "reply_priming": 0,
            "budget": 0,
        }
    noted: dict[str, int] = {}
    for kind in (r[1] for r in repairs_of(inspection)):
        noted[kind] = noted.get(kind, 0) + 1
    noted.pop("truncated", None)
    assert noted == {k: n for k, n in stats["repairs"].items() if n}
    json.dumps(inspection.as_dict())  # JSON all the way down


def test_a_moved_result_and_a_removed_call_are_told_where_they_are() -> None:
    memory = ConversationTokenBufferMemory(400, token_counter=COUNTER)
    memory.add_messages([{"role": "system", "content": "You take coffee orders."}])
    memory.add_messages(
        [user("a latte"), call("c1", "c2"), user("wait"), result("c1"), reply("ok")]
    )
    inspection = memory.inspect()
    consistent(memory, inspection)
    assert [t.fate for t in inspection.turns] == ["context", "context"]
    assert repairs_of(inspection) == [
        ("assistant", "dropped_unanswered_calls", "c2"),
        ("found", "moved_results", "c1"),
    ]
    calls, moved = inspection.turns[0].messages[1], inspection.turns[1].messages[1]
    assert [c.id for c in calls.sent.tool_calls] == ["c1"]  # type: ignore[union-attr]
    assert moved.repairs[0].after == calls.message.id
    assert moved.repairs[0].describe() == "moved to follow its call c1"
    # Sent as the call's turn: the result right after its call, the interjection after it.
    assert [a.message.role.value for a in inspection.turns[0].sent] == ["user", "assistant", "tool"]
    assert [a.message.text for a in inspection.turns[1].sent] == ["wait", "ok"]
    # Its tokens count in its call's turn, as the budget counts them.
    assert inspection.turns[0].sent_tokens == calls.sent_tokens + moved.sent_tokens + (
        inspection.turns[0].messages[0].sent_tokens
    )
    assert inspection.system[0].in_context


def test_a_result_whose_call_was_evicted_is_an_orphan_of_the_context() -> None:
    memory = ConversationBufferWindowMemory(k=1)
    memory.add_messages([user("a latte"), call("c1"), user("wait"), result("c1"), reply("ok")])
    inspection = memory.inspect(token_counter=COUNTER)
    consistent(memory, inspection)
    assert [t.fate for t in inspection.turns] == ["evicted", "context"]
    assert repairs_of(inspection) == [("found", "dropped_orphan_results", "c1")]
    assert inspection.tokens.budget is None
    assert inspection.tokens.total == COUNTER.count_messages(memory.get_context())


def test_a_greeting_is_evicted_and_says_why() -> None:
    memory = ConversationBufferMemory()
    memory.add_messages([reply("Welcome!"), user("hi"), reply("hello")])
    inspection = memory.inspect(token_counter=COUNTER)
    consistent(memory, inspection)
    assert [t.fate for t in inspection.turns] == ["evicted", "context"]
    assert repairs_of(inspection) == [("Welcome!", "dropped_before_user", None)]


def test_a_cut_text_says_how_many_tokens_went() -> None:
    memory = ConversationTokenBufferMemory(60, token_counter=COUNTER)
    memory.add_messages([user("tell me everything " * 40), reply("short")])
    inspection = memory.inspect()
    consistent(memory, inspection)
    [(_, kind, _)] = repairs_of(inspection)
    assert kind == "truncated"
    cut = inspection.turns[0].messages[0].repairs[0].tokens
    assert cut == inspection.stats["truncated_tokens"] > 0  # type: ignore[typeddict-item]
    assert inspection.turns[0].messages[0].sent_tokens < inspection.turns[0].messages[0].tokens


def test_a_renamed_call_id_is_told_with_its_new_id() -> None:
    memory = ConversationBufferMemory()
    memory.add_messages([user("a"), call("call_0"), result("call_0"), reply("x")])
    memory.add_messages([user("b"), call("call_0"), result("call_0"), reply("y")])
    inspection = memory.inspect(token_counter=COUNTER)
    consistent(memory, inspection)
    [renamed] = [r for t in inspection.turns for a in t.messages for r in a.repairs]
    assert (renamed.kind, renamed.call_id, renamed.new_id) == (
        "renamed_call_ids",
        "call_0",
        "call_0_2",
    )


class Words:
    """A summarizer that keeps the first word of every user message."""

    def __init__(self) -> None:
        self.down = False

    def summarize(self, previous_summary: str, messages: Sequence[Message]) -> str:
        if self.down:
            raise RuntimeError("down")
        said = [m.text.split()[0] for m in messages if m.role == "user"]
        return " ".join(filter(None, [previous_summary, *said]))

    async def asummarize(self, previous_summary: str, messages: Sequence[Message]) -> str:
        return self.summarize(previous_summary, messages)


def test_a_summary_memory_tells_summary_then_pending_then_context() -> None:
    words = Words()
    memory = ConversationSummaryBufferMemory(55, token_counter=COUNTER, summarizer=words)
    for i in range(3):
        memory.add_messages([user(f"t{i} " + "and " * 12), reply("ok")])
    words.down = True
    for i in range(3, 6):
        memory.add_messages([user(f"t{i} " + "and " * 12), reply("ok")])
    inspection = memory.inspect()
    consistent(memory, inspection)
    fates = [t.fate for t in inspection.turns]
    assert fates[0] == "summary"
    assert "pending" in fates
    assert fates == sorted(fates, key=["summary", "pending", "context"].index)
    summarized = [t.number for t in inspection.turns if t.fate == "summary"]
    assert inspection.summary is not None
    assert inspection.summary.text.split()[-len(summarized) :] == [f"t{n - 1}" for n in summarized]
    words.down = False
    healed = memory.inspect()  # the inspection's read folds, as every read does
    assert "pending" not in [t.fate for t in healed.turns]
    consistent(memory, healed)


def test_a_context_over_the_budget_is_an_error_not_an_exception() -> None:
    memory = ConversationTokenBufferMemory(40, token_counter=COUNTER, overflow="raise")
    memory.add_messages([user("much too long " * 20), reply("ok")])
    inspection = memory.inspect()
    assert isinstance(inspection.error, ContextOverflowError)
    assert "over the budget" in str(inspection.error)
    with pytest.raises(ContextOverflowError):
        memory.get_context()  # what get_context() raises
    assert inspection.context == ()
    assert [t.fate for t in inspection.turns] == ["evicted"]


def test_turns_asks_for_the_newest_turns_only() -> None:
    memory = ConversationBufferWindowMemory(k=2)
    for i in range(10):
        memory.add_messages([user(f"q{i}"), reply(f"a{i}")])
    inspection = memory.inspect(turns=3, token_counter=COUNTER)
    assert [t.number for t in inspection.turns] == [8, 9, 10]
    assert [t.fate for t in inspection.turns] == ["evicted", "context", "context"]
    assert inspection.fates() == {"context": 2, "summary": 0, "pending": 0, "evicted": 8}
    assert [t.number for t in memory.inspect(turns=0, token_counter=COUNTER).turns] == [9, 10]
    with pytest.raises(ConfigurationError, match="turns must be"):
        memory.inspect(turns=-1)


def test_the_async_twin_says_the_same() -> None:
    store = InMemoryStore()
    memory = ConversationTokenBufferMemory(100, token_counter=COUNTER, store=store)
    memory.add_messages([user("a latte"), call("c1"), user("wait"), result("c1"), reply("ok")])
    assert asyncio.run(memory.ainspect()) == memory.inspect()


def test_an_inspection_is_frozen() -> None:
    memory = ConversationBufferMemory()
    memory.add_messages([user("hi"), reply("hello")])
    inspection = memory.inspect(token_counter=COUNTER)
    with pytest.raises(dataclasses.FrozenInstanceError):
        inspection.error = None  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        inspection.turns[0].fate = "evicted"  # type: ignore[misc]
    assert isinstance(inspection.turns, tuple)

"""Invariants of the memories over generated, well-formed tool-call conversations."""

from __future__ import annotations

import itertools
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from _conversations import scan_turns, sendable
from zerda.memory import ConversationBufferMemory, ConversationBufferWindowMemory
from zerda.messages import Message, Role, ToolCall, group_turns
from zerda.policies import last_turns

KS = range(1, 7)


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    """Optional leading system messages and opening greeting; whole turns (a user message, then
    plain replies and tool-call messages each followed by results for all their calls); system
    messages sprinkled anywhere; optionally a last turn still waiting for tool results."""
    counter = itertools.count()
    out: list[Message] = []

    def text() -> str:
        return f"text {next(counter)}"

    def add(message: Message) -> None:
        out.append(message)
        if draw(st.integers(0, 5)) == 0:
            out.append(Message(Role.SYSTEM, f"system {text()}"))

    def tool_call_message() -> list[str]:
        ids = [f"call-{next(counter)}" for _ in range(draw(st.integers(1, 3)))]
        content = draw(st.sampled_from([None, "let me check"]))
        add(Message(Role.ASSISTANT, content, tool_calls=tuple(ToolCall(i, "fn") for i in ids)))
        return ids

    def steps(max_steps: int) -> None:
        for _ in range(draw(st.integers(0, max_steps))):
            if draw(st.booleans()):
                add(Message(Role.ASSISTANT, text()))
            else:
                ids = tool_call_message()
                for call_id in draw(st.permutations(ids)):
                    add(Message(Role.TOOL, text(), tool_call_id=call_id))

    for _ in range(draw(st.integers(0, 2))):
        out.append(Message(Role.SYSTEM, f"leading {text()}"))
    if draw(st.integers(0, 4)) == 0:
        add(Message(Role.ASSISTANT, f"greeting {text()}"))
    for _ in range(draw(st.integers(0, 6))):
        add(Message(Role.USER, text()))
        steps(3)
    if draw(st.booleans()):
        add(Message(Role.USER, text()))
        steps(2)
        ids = tool_call_message()
        answered = draw(st.lists(st.sampled_from(ids), unique=True, max_size=len(ids) - 1))
        for call_id in answered:
            add(Message(Role.TOOL, text(), tool_call_id=call_id))
    return out


def check_window(memory: ConversationBufferWindowMemory, stored: list[Message], k: int) -> None:
    turns = scan_turns(stored)
    window = turns[-k:]
    systems = [m for m in stored if m.role is Role.SYSTEM]
    context = memory.get_context()

    # The window is the last k turns of the whole conversation, as a provider takes them: a
    # call without its result yet is left out, and a greeting before the first user message.
    assert [list(t.messages) for t in group_turns(stored)] == turns
    assert context == systems + sendable([m for t in window for m in t])
    rest = context[len(systems) :]
    assert [list(t.messages) for t in group_turns(rest)] == scan_turns(rest)
    assert len(memory.get_messages()) == len(scan_turns(rest))
    assert memory.get_history() == stored, "the log is never changed"

    # Opens on a user message; no result without its call, no call without its result.
    if rest:
        assert rest[0].role is Role.USER
    calls_seen: set[str] = set()
    for m in rest:
        if m.role is Role.TOOL:
            assert m.tool_call_id in calls_seen
        calls_seen.update(c.id for c in m.tool_calls)
    assert calls_seen == {m.tool_call_id for m in rest if m.role is Role.TOOL}
    # What was left out is only what the whole conversation still waits for.
    all_calls = {c.id for m in stored for c in m.tool_calls}
    all_answered = {m.tool_call_id for m in stored if m.role is Role.TOOL}
    window_calls = {c.id for t in window for m in t for c in m.tool_calls}
    greeting = {
        c.id
        for m in (turns[0] if turns and turns[0][0].role is not Role.USER else [])
        for c in m.tool_calls
    }
    assert window_calls - calls_seen <= (all_calls - all_answered) | greeting


@settings(max_examples=150, deadline=None)
@given(conversations())
def test_window_invariants_hold_for_every_prefix(conversation: list[Message]) -> None:
    memories = {k: ConversationBufferWindowMemory(k=k) for k in KS}
    stored: dict[int, list[Message]] = {k: [] for k in KS}
    for message in conversation:
        for k, memory in memories.items():
            stored[k].append(memory.add_message(message))
            check_window(memory, stored[k], k)


@settings(max_examples=60, deadline=None)
@given(conversations())
def test_buffer_context_is_systems_then_everything_and_history_is_the_input(
    conversation: list[Message],
) -> None:
    memory = ConversationBufferMemory()
    stored = [memory.add_message(m) for m in conversation]

    history = memory.get_history()
    assert history == stored
    assert [replace(m, created_at=None, id=None) for m in history] == conversation
    assert all(m.created_at is not None for m in history)
    assert len({m.id for m in history}) == len(history), "each message its own id"

    systems = [m for m in stored if m.role is Role.SYSTEM]
    others = [m for m in stored if m.role is not Role.SYSTEM]
    context = memory.get_context()
    assert context == systems + sendable(others)
    assert len(memory.get_messages()) == len(scan_turns(context[len(systems) :]))


@settings(max_examples=60, deadline=None)
@given(conversations(), st.integers(1, 6))
def test_batch_and_one_by_one_adds_agree(conversation: list[Message], k: int) -> None:
    one_by_one = ConversationBufferWindowMemory(k=k)
    for m in conversation:
        one_by_one.add_message(m)
    batched = ConversationBufferWindowMemory(k=k)
    batched.add_messages(conversation)

    def strip(messages: list[Message]) -> list[Message]:
        return [replace(m, created_at=None, id=None) for m in messages]

    assert strip(batched.get_context()) == strip(one_by_one.get_context())
    assert strip(batched.get_history()) == conversation


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.text(max_size=8), st.text(max_size=8)), max_size=12),
    st.integers(1, 6),
    st.one_of(st.none(), st.integers(0, 8)),
)
def test_seed_window_keeps_last_k_turns(
    pairs: list[tuple[str, str]], k: int, limit: int | None
) -> None:
    memory = ConversationBufferWindowMemory(k=k)
    for i, o in pairs:
        memory.save_context({"input": i}, {"output": o})

    kept = pairs[-k:] if pairs else []
    assert [(t["input"], t["output"]) for t in memory.get_messages()] == kept
    expected = kept if limit is None else kept[len(kept) - min(limit, len(kept)) :]
    assert [(t["input"], t["output"]) for t in memory.get_messages(limit=limit)] == expected
    chars = sum(len(i) + len(o) for i, o in kept)
    stats = memory.get_memory_stats()
    assert stats["total_characters"] == chars
    assert stats["estimated_tokens"] == chars // 4
    assert stats["message_count"] == len(kept)
    assert memory.get_window_info()["available_slots"] == k - len(kept)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(), max_size=20), st.one_of(st.none(), st.integers(0, 25)))
def test_last_turns_policy_keeps_the_newest_k(turns: list[int], k: int | None) -> None:
    kept = list(last_turns(turns, k))
    if k is None:
        assert kept == turns
    else:
        assert len(kept) == min(k, len(turns))
        assert kept == turns[len(turns) - len(kept) :]
